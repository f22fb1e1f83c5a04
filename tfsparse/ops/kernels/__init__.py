"""Loader of tfsparse's compiled CPU kernels, and the choice of their variant.

The library holds every kernel three times, compiled for three instruction
sets: ``"avx512"`` (AVX-512 F/DQ/BW/VL), ``"avx2"`` (AVX2 + FMA) and
``"portable"`` (the architecture's baseline; the only one off x86-64). The
widest one the CPU supports runs, unless the environment says otherwise:

- ``TFSPARSE_ISA=avx512|avx2|portable`` forces a variant (an error when the
  CPU lacks it);
- ``TFSPARSE_USE_KERNELS=0`` runs the pure-TensorFlow fallback instead;
- ``TFSPARSE_REQUIRE_KERNELS=1`` makes a missing, stale or unloadable
  library an error instead of a warning and the fallback (CI sets it).

``use_isa`` switches the variant for the ops traced inside it, so variants
can be compared in one process.

Example:
  >>> from tfsparse.ops import kernels
  >>> kernels.isa() in (None, "avx512", "avx2", "portable")
  True
"""

import contextlib
import ctypes
import json
import logging
import os
import pathlib
import threading

import tensorflow as tf

from tfsparse import _validation

LIBRARY_PATH = pathlib.Path(__file__).resolve().parent / "_tfsparse_kernels.so"
BUILD_INFO_PATH = LIBRARY_PATH.with_suffix(".json")
# Widest first; bit i of the library's mask is ISAS[::-1][i].
ISAS = ("avx512", "avx2", "portable")
_BITS = {"portable": 0, "avx2": 1, "avx512": 2}
_REBUILD = "Rebuild them with `python -m tfsparse.ops.build` (or reinstall tfsparse)."
_logger = logging.getLogger("tfsparse")
_state = {"loaded": False, "library": None, "supported": (), "default": None}
_local = threading.local()


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _unavailable(message):
    """The library cannot serve: an error when required, else a warning."""
    if _flag("TFSPARSE_REQUIRE_KERNELS"):
        raise RuntimeError(f"{message} (TFSPARSE_REQUIRE_KERNELS is set)")
    _logger.warning("%s; using the slower pure-TensorFlow fallback.", message)


def _built_against():
    """The TensorFlow version the library was built against, or None."""
    try:
        return json.loads(BUILD_INFO_PATH.read_text())["tensorflow_version"]
    except (OSError, ValueError, KeyError):
        return None


def _supported_isas(path):
    """The variants this CPU supports, widest first (asked of the library)."""
    mask = ctypes.CDLL(str(path)).tfsparse_supported_isas()
    return tuple(isa for isa in ISAS if mask >> _BITS[isa] & 1)


def _default_isa(supported):
    forced = os.environ.get("TFSPARSE_ISA", "").strip().lower()
    if not forced:
        return supported[0]
    if forced not in ISAS:
        raise _validation.invalid_value("TFSPARSE_ISA", _validation.one_of(ISAS), forced)
    if forced not in supported:
        raise RuntimeError(
            f"TFSPARSE_ISA={forced} asks for a kernel variant this CPU does not "
            f"support; it supports {', '.join(supported)}.")
    return forced


def _load():
    if _state["loaded"]:
        if _state.get("error") is not None:
            raise _state["error"]
        return _state["library"]
    _state["loaded"] = True
    try:
        return _load_once()
    except (RuntimeError, ValueError) as error:
        # A configuration error (TFSPARSE_ISA, TFSPARSE_REQUIRE_KERNELS) is
        # raised again at every later call: caught once, it must not leave
        # the process on the fallback.
        _state["error"] = error
        raise


def _load_once():
    if os.environ.get("TFSPARSE_USE_KERNELS", "1").strip().lower() in ("0", "false", "no"):
        if _flag("TFSPARSE_REQUIRE_KERNELS"):
            raise RuntimeError(
                "TFSPARSE_USE_KERNELS=0 and TFSPARSE_REQUIRE_KERNELS=1 contradict "
                "each other: unset one of them.")
        return None
    if not LIBRARY_PATH.exists():
        _unavailable(f"tfsparse: compiled kernels not found at {LIBRARY_PATH}. {_REBUILD}")
        return None
    built_against = _built_against()
    if built_against != tf.__version__:
        _unavailable(
            f"tfsparse: the compiled kernels at {LIBRARY_PATH} were built against "
            f"TensorFlow {built_against or 'an unknown version'}, but TensorFlow "
            f"{tf.__version__} is installed, whose ABI may differ, so they are not "
            f"loaded. {_REBUILD}")
        return None
    try:
        library = tf.load_op_library(str(LIBRARY_PATH))
        supported = _supported_isas(LIBRARY_PATH)
    except (tf.errors.NotFoundError, OSError, AttributeError) as error:
        _unavailable(f"tfsparse: could not load {LIBRARY_PATH} ({error}). {_REBUILD}")
        return None
    _state["default"] = _default_isa(supported)
    _state["supported"] = supported
    _state["library"] = library
    return library


def available():
    """True when the compiled kernels are built, loadable and enabled."""
    return _load() is not None


def supported_isas():
    """The kernel variants this CPU can run, widest first (``()`` without kernels).

    Example:
      >>> from tfsparse.ops import kernels
      >>> set(kernels.supported_isas()) <= {"avx512", "avx2", "portable"}
      True
    """
    _load()
    return _state["supported"]


def isa():
    """The kernel variant that runs: ``"avx512"``, ``"avx2"`` or ``"portable"``.

    ``None`` when the compiled kernels are not available (the pure-TensorFlow
    fallback runs). Inside ``use_isa(name)``, that variant.
    """
    if _load() is None:
        return None
    return getattr(_local, "isa", None) or _state["default"]


@contextlib.contextmanager
def use_isa(name):
    """Runs the kernels traced inside the block on variant ``name``.

    Functions traced before keep the variant they were traced with (it is an
    attribute of their ops), so trace a new ``tf.function`` per variant.

    Args:
      name: ``"avx512"``, ``"avx2"`` or ``"portable"`` (any case, as
        ``TFSPARSE_ISA``); the CPU must support it.

    Example:
      >>> from tfsparse.ops import kernels
      >>> if kernels.available():
      ...     with kernels.use_isa("portable"):
      ...         assert kernels.isa() == "portable"
    """
    if _load() is None:
        raise RuntimeError("tfsparse's compiled kernels are not available. " + _REBUILD)
    if isinstance(name, str) and name.strip().lower() in ISAS:
        name = name.strip().lower()  # as TFSPARSE_ISA takes it
    if name not in ISAS:
        raise _validation.invalid_value("name", _validation.one_of(ISAS), name)
    if name not in _state["supported"]:
        raise RuntimeError(
            f"This CPU does not support the {name!r} kernel variant; it supports "
            f"{', '.join(_state['supported'])}.")
    previous = getattr(_local, "isa", None)
    _local.isa = name
    try:
        yield name
    finally:
        _local.isa = previous


def _library():
    library = _load()
    if library is None:
        raise RuntimeError("tfsparse's compiled kernels are not available. " + _REBUILD)
    return library


def sddmm(x_t, dy_t, rows, cols, batch_major=False):
    """The compiled SDDMM kernel; see ``tfsparse.ops.sddmm``.

    ``batch_major=True``: ``x_t`` and ``dy_t`` are given untransposed,
    ``[batch, input_dim]`` and ``[batch, units]``; the op transposes them
    itself (faster than ``tf.transpose``). Results equal the transposed
    inputs' bit for bit while ``x`` takes up to 2 MiB; a larger ``x`` is
    summed in slices of the batch (another order of the same sums).
    """
    return _library().tfsparse_sddmm(x_t, dy_t, rows, cols, isa=isa(),
                                     batch_major=bool(batch_major))


def spmm(x, values, idx, seg, units, bias=None, order=None):
    """``y[b, j] = bias[j] + sum_{k: seg[k] == j} x[b, idx[k]] * values[k]``.

    ``seg`` (int32) must be sorted, with entries in ``[0, units)``;
    ``bias=None`` adds nothing. ``order`` (int32 ``[nnz]``, optional): use
    the nonzeros in that order, ``values[order]``, ``idx[order]`` and
    ``seg[order]`` (which must then be sorted), permuted inside the op; the
    permuted, validated pattern is kept between calls while ``order``,
    ``idx`` and ``seg`` stay equal (compared in full on every call).
    """
    x = tf.convert_to_tensor(x)
    if bias is None:
        bias = tf.zeros([0], x.dtype)
    if order is None:
        order = tf.zeros([0], tf.int32)
    return _library().tfsparse_spmm(x, values, idx, seg, bias, order, units=int(units),
                                    isa=isa())


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
        sample_chunks=sample_chunks, isa=isa(),
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
        memory=memory, isa=isa(),
    )
