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


def spmm(x, values, idx, seg, units, bias=None):
    """``y[b, j] = bias[j] + sum_{k: seg[k] == j} x[b, idx[k]] * values[k]``.

    ``seg`` (int32) must be sorted, with entries in ``[0, units)``;
    ``bias=None`` adds nothing.
    """
    x = tf.convert_to_tensor(x)
    if bias is None:
        bias = tf.zeros([0], x.dtype)
    return _library().tfsparse_spmm(x, values, idx, seg, bias, units=int(units))


def sidco(flat, stages, ratio, first_ratio, distribution, exclude_zeros,
          exact_count_limit, sample_chunk, sample_chunks):
    """The compiled fused SIDCo op: ``(values, indices, threshold)``.

    See ``tfsparse.compression.sidco_select``, which decides between it and
    the pure-TensorFlow path and passes the estimator's constants.
    """
    return _library().tfsparse_sidco(
        flat, stages, ratio, first_ratio,
        distribution=distribution, exclude_zeros=exclude_zeros,
        exact_count_limit=exact_count_limit, sample_chunk=sample_chunk,
        sample_chunks=sample_chunks,
    )


def sidco_adaptive(flat, stages, adaptation, ratio, first_ratio, distribution,
                   exclude_zeros, exact_count_limit, sample_chunk, sample_chunks,
                   max_stages, adapt_every, band_low, band_high, memory):
    """The compiled adaptive SIDCo op: selects as ``sidco``, then updates the
    ``stages`` (int32) and ``adaptation`` (float64) variables in place.

    Returns ``(values, indices, threshold)``. See
    ``tfsparse.compression.sidco_select.sidco_select_adaptive``.
    """
    return _library().tfsparse_sidco_adaptive(
        flat, stages.handle, adaptation.handle,
        tf.constant(ratio, tf.float64), tf.constant(first_ratio, tf.float64),
        distribution=distribution, exclude_zeros=exclude_zeros,
        exact_count_limit=exact_count_limit, sample_chunk=sample_chunk,
        sample_chunks=sample_chunks, max_stages=max_stages,
        adapt_every=adapt_every, band_low=band_low, band_high=band_high,
        memory=memory,
    )
