"""Runs a test script under a real ``horovodrun -np N -H localhost:N --gloo``.

``run_script`` returns the job's output. For ``run_ranks`` the script gets the
output folder as its first argument and writes ``rank{r}.json`` there for
every rank; ``run_ranks`` returns those results, and ``assert_arrays_close``
compares their lists of arrays.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BESIDE_PYTHON = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def run_script(script, args=(), size=2, timeout=400):
    """Runs ``script *args`` on ``size`` ranks; returns its stdout (exit 0 asserted)."""
    launcher = _BESIDE_PYTHON if os.path.exists(_BESIDE_PYTHON) else shutil.which("horovodrun")
    if launcher is None:
        pytest.skip("horovodrun is not installed (Horovod missing)")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [launcher, "-np", str(size), "-H", f"localhost:{size}", "--gloo",
               sys.executable, str(script), *(str(a) for a in args)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def run_ranks(script, out, size=2, args=(), timeout=400):
    """Runs ``script out *args`` on ``size`` ranks; returns each rank's JSON result."""
    run_script(script, (out, *args), size, timeout)
    results = []
    for rank in range(size):
        with open(os.path.join(out, f"rank{rank}.json")) as handle:
            results.append(json.load(handle))
    return results


def assert_arrays_close(a, b, **tolerance):
    """Asserts two equally long lists of arrays (as JSON results hold them) are close."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.array(x), np.array(y), **tolerance)
