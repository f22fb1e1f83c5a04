"""Runs a checks script in a fresh process and compares the weights it reports.

Logical devices must be configured before TensorFlow initialises its devices,
so the multi-device checks run as scripts in their own process and write
their results as JSON; the test modules assert on those.
"""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_checks(script, out, timeout_s):
    """Runs ``script out`` with the repository on the path; returns its JSON."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, script, str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    with open(out) as handle:
        return json.load(handle)


def assert_weights_close(got, want, **tolerance):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), **tolerance)
