"""Shared pytest set-up: quiet TensorFlow, CPU only, Keras 2 before anything."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pytest  # noqa: E402

import tfsparse  # noqa: E402,F401  (selects tf_keras before any test imports Keras)
from tfsparse.ops import kernels  # noqa: E402


@pytest.fixture(autouse=True)
def _kernel_variant(request):
    """Runs a case marked ``isa(name)`` on that variant of the kernels (kernel_paths.py)."""
    mark = request.node.get_closest_marker("isa")
    if mark is None:
        yield
        return
    with kernels.use_isa(mark.args[0]):
        yield
