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


def test_serving_checks_its_inputs_and_labels(tmp_path):
    # Before: rows of the wrong width, a single 1-D row or float64 rows
    # ended in TensorFlow's or TFLite's errors (out-of-bounds gathers), and
    # labels of another length in a NumPy broadcast error.
    import numpy as np
    import tensorflow as tf

    from tfsparse import SparseDense
    from tfsparse import keras

    model = keras.Sequential([keras.Input((6,)), SparseDense(3, density=0.5, seed=0,
                                                             activation="softmax")])
    tf.saved_model.save(model, str(tmp_path / "model"))
    rows = np.random.default_rng(0).random((4, 6))  # float64, as x / 255 gives
    files = {"rows": rows, "narrow": rows[:, :5], "one": rows[0], "labels": np.zeros(3)}
    for name, array in files.items():
        np.save(tmp_path / f"{name}.npy", array)

    def serve(*args):
        env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="")
        return subprocess.run(
            [sys.executable, str(ROOT / "examples" / "serve_saved_model.py"),
             str(tmp_path / "model"), *args], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120)

    served = serve("--inputs", "rows.npy")
    assert served.returncode == 0, served.stderr[-2000:]
    want = model.predict(rows.astype("float32"), verbose=0).argmax(axis=1).tolist()
    assert f"predictions: {want}" in served.stdout
    for name, shape in (("narrow", "(4, 5)"), ("one", "(6,)")):
        run = serve("--inputs", f"{name}.npy")
        assert run.returncode == 2
        assert f"--inputs: expected inputs of the model's shape (n, 6); " \
            f"received shape {shape}" in run.stderr
    run = serve("--inputs", "rows.npy", "--labels", "labels.npy")
    assert run.returncode == 2 and "--labels: expected one label per input row" in run.stderr
    # Missing files: before, tracebacks.
    run = serve("--inputs", "absent.npy")
    assert run.returncode == 2 and "--inputs: absent.npy does not exist" in run.stderr
    # A convolutional model takes images: before, its inputs were checked
    # as rows of "the model's 1 features".
    from tfsparse import SparseConv2D

    cnn = keras.Sequential([keras.Input((5, 5, 1)), SparseConv2D(2, 3, density=0.5, seed=0),
                            keras.layers.Flatten(), SparseDense(3, seed=1, activation="softmax")])
    tf.saved_model.save(cnn, str(tmp_path / "model"))
    images = np.random.default_rng(1).random((4, 5, 5, 1))
    np.save(tmp_path / "images.npy", images)
    served = serve("--inputs", "images.npy")
    assert served.returncode == 0, served.stderr[-2000:]
    want = cnn.predict(images.astype("float32"), verbose=0).argmax(axis=1).tolist()
    assert f"predictions: {want}" in served.stdout
    run = serve("--inputs", "rows.npy")
    assert run.returncode == 2
    assert "--inputs: expected inputs of the model's shape (n, 5, 5, 1); received shape (4, 6)" \
        in run.stderr


def test_pipeline_example_takes_any_micro_batch_count_up_to_the_batch(tmp_path):
    # It required --microbatches to divide --batch-size, which PipelineStrategy
    # no longer needs (micro-batches then differ by one row).
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "pipeline_mnist.py"),
                          "--batch-size", "3", "--microbatches", "4"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--microbatches must be at most --batch-size=3, received 4" in run.stderr


@pytest.mark.parametrize("example, default_prune_epoch", [("fssl_mnist.py", 8),
                                                           ("fssl_cnn.py", 5)])
def test_fssl_examples_refuse_a_prune_epoch_past_the_last_epoch(example, default_prune_epoch,
                                                                 tmp_path):
    # --epochs 3 with the default prune epoch trained, then FSSL stopped it
    # with a traceback.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--epochs", "3"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert (f"error: --prune-epoch must be at most --epochs=3, received {default_prune_epoch}"
            in run.stderr)
    assert not any(tmp_path.iterdir())


def test_pipeline_example_names_the_schedules_it_takes(tmp_path):
    from tfsparse.distribute import SCHEDULES

    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "pipeline_mnist.py"),
                          "--schedule", "bogus"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2  # was a traceback after profiling every schedule
    choices = ", ".join(f"'{name}'" for name in SCHEDULES)
    assert f"argument --schedule: invalid choice: 'bogus' (choose from {choices})" in run.stderr


@pytest.mark.parametrize("example, arguments, message", [
    ("horovod_sidco_mnist.py", ["--data", "absent"], "error: --data: absent does not exist"),
    ("serve_saved_model.py", ["model.keras", "--inputs", "rows.npy"],
     "error: model: expected a SavedModel directory or a .tflite file; received model.keras"),
])
def test_a_path_of_the_wrong_kind_is_an_argparse_error(example, arguments, message, tmp_path):
    # Both ended in tracebacks (FileNotFoundError; SavedModel file does not exist).
    import numpy as np

    (tmp_path / "model.keras").write_bytes(b"")
    np.save(tmp_path / "rows.npy", np.zeros((1, 4), np.float32))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), *arguments],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert message in run.stderr
