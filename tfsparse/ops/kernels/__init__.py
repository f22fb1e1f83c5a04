"""Loader of tfsparse's optional compiled kernels (``make setup`` builds them).

Set ``TFSPARSE_USE_KERNELS=0`` to run on the pure-TensorFlow fallback.
"""

import logging
import os
import pathlib

import tensorflow as tf

LIBRARY_PATH = pathlib.Path(__file__).resolve().parent / "_tfsparse_kernels.so"
_logger = logging.getLogger("tfsparse")
_state = {"loaded": False, "library": None}


def _load():
    if _state["loaded"]:
        return _state["library"]
    _state["loaded"] = True
    if os.environ.get("TFSPARSE_USE_KERNELS", "1").strip() in ("0", "false"):
        return None
    if not LIBRARY_PATH.exists():
        _logger.warning(
            "tfsparse: compiled kernels not found at %s; using the slower "
            "pure-TensorFlow fallback. Build them with "
            "`python -m tfsparse.ops.build`.",
            LIBRARY_PATH,
        )
        return None
    try:
        _state["library"] = tf.load_op_library(str(LIBRARY_PATH))
    except tf.errors.NotFoundError as error:
        _logger.warning(
            "tfsparse: could not load %s (%s); using the pure-TensorFlow "
            "fallback. Rebuild with `python -m tfsparse.ops.build`.",
            LIBRARY_PATH,
            error,
        )
    return _state["library"]


def available():
    """True when the compiled kernels are built, loadable and enabled."""
    return _load() is not None


def _library():
    library = _load()
    if library is None:
        raise RuntimeError(
            "tfsparse's compiled kernels are not available; build them with "
            "`python -m tfsparse.ops.build`."
        )
    return library


def sddmm(x_t, dy_t, rows, cols):
    """The compiled SDDMM kernel; see ``tfsparse.ops.sddmm``."""
    return _library().tfsparse_sddmm(x_t, dy_t, rows, cols)


def spmm(x, values, idx, ptr):
    """``y[b, j] = sum_{ptr[j] <= k < ptr[j+1]} x[b, idx[k]] * values[k]``."""
    return _library().tfsparse_spmm(x, values, idx, ptr)
