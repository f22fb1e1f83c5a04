"""The examples refuse nonsensical numeric options before doing any work."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("example,option,value,expected", [
    ("fssl_cnn.py", "--epochs", "0", "a positive integer"),
    ("fssl_mnist.py", "--prune-epoch", "0", "a positive integer"),
    ("horovod_sidco_mnist.py", "--learning-rate", "-1", "a finite positive float"),
    ("mnist_sparse.py", "--density", "1.5", "a float in (0, 1]"),
    ("partitioned_training.py", "--epochs", "0", "a positive integer"),
    ("rigl_mnist.py", "--sparsity", "1.5", "a float in (0, 1)"),
    ("sparse_resnet_mnist.py", "--sparsity", "1.5", "a float in (0, 1)"),
])
def test_a_bad_option_is_an_argparse_error(example, option, value, expected, tmp_path):
    # Before, these trained (or loaded data) first and ended in a library
    # traceback, or ran silently (rigl_mnist at sparsity 0, the SIDCo example
    # at learning rate -1).
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), option, value],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    name = option.lstrip("-").replace("-", "_")
    assert f"error: {option}: Received an invalid value for \"{name}\", expected {expected}" \
        in run.stderr
    assert not any(tmp_path.iterdir())  # nothing written
