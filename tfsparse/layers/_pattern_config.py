"""A sparsity pattern as a compact, JSON-safe config entry.

``get_config`` must describe a layer's pattern so that ``from_config`` (and
so ``keras.models.clone_model``) rebuilds the same network. The positions are
stored as the column-major keys ``col * input_dim + row`` (sorted, so their
differences are small positive integers), as little-endian unsigned
differences, zlib-compressed and base64-encoded: about 1-2 bytes per nonzero
for random patterns.
"""

import base64
import hashlib
import zlib

import numpy as np
import tensorflow as tf

from tfsparse._validation import invalid_value
from tfsparse.ops import SparsityPattern

ENCODING = "zlib-delta-u32"
_ENCODING_64 = "zlib-delta-u64"


def digest(rows, cols):
    """A fingerprint of a pattern's positions (SHA-256 of the index arrays).

    A layer keeps the digest of the pattern it built from its seed; its
    ``get_config`` describes the seed while the pattern is that one, and the
    positions once it moved (``set_pattern``) or was loaded.
    """
    return hashlib.sha256(np.asarray(rows, np.int32).tobytes()
                          + np.asarray(cols, np.int32).tobytes()).hexdigest()


def check_replacement(pattern, shape, nnz):
    """Raises unless ``pattern`` is a ``SparsityPattern`` of ``shape`` with ``nnz`` nonzeros.

    A layer's ``set_pattern`` takes only a pattern with as many nonzeros as
    its own (its weights keep their shapes).
    """
    if not isinstance(pattern, SparsityPattern):
        raise invalid_value("pattern", "a tfsparse.ops.SparsityPattern",
                            received=f"pattern of type {type(pattern).__name__}")
    if pattern.shape != tuple(shape) or pattern.nnz != nnz:
        raise invalid_value(
            "pattern", f"a pattern of shape {tuple(shape)} with {nnz} nonzeros (the layer's)",
            received=f"pattern of shape {pattern.shape} with {pattern.nnz} nonzeros")


def check_values(values, dtype):
    """Raises ``ValueError`` (naming ``pattern``) unless every one of ``values``
    is finite and stays finite in the layer's variable ``dtype`` (7e4 is inf
    in float16).

    Example:
      >>> check_values(np.array([1.0, 7e4]), "float32")
      >>> check_values(np.array([1.0, 7e4]), "float16")
      Traceback (most recent call last):
      ...
      ValueError: Received an invalid value for "pattern", expected finite values in the \
layer's dtype float16. Received: 1 value(s) beyond its range (the largest: 70000)
    """
    values = np.asarray(values)
    if not np.all(np.isfinite(values)):
        raise invalid_value("pattern", "finite values",
                            received=f"pattern with {int(np.sum(~np.isfinite(values)))} "
                                     "non-finite values")
    cast = tf.cast(values, dtype).numpy().astype(np.float64)
    beyond = ~np.isfinite(cast)
    if np.any(beyond):
        raise invalid_value(
            "pattern", f"finite values in the layer's dtype {tf.as_dtype(dtype).name}",
            received=f"{int(beyond.sum())} value(s) beyond its range (the largest: "
                     f"{np.max(np.abs(values)):g})")


def encode(pattern):
    """The config entry of a ``SparsityPattern``: shape, nnz and packed positions.

    Example:
      >>> pattern = SparsityPattern.from_coo([0, 2, 1], [0, 0, 1], (3, 2))
      >>> entry = encode(pattern)
      >>> decode(entry) == pattern, entry["nnz"]
      (True, 3)
    """
    input_dim, units = pattern.shape
    keys = pattern.cols.astype(np.int64) * input_dim + pattern.rows.astype(np.int64)
    deltas = np.diff(keys, prepend=np.int64(0))
    wide = deltas.size and int(deltas.max()) >= 2**32
    dtype, encoding = ("<u8", _ENCODING_64) if wide else ("<u4", ENCODING)
    packed = zlib.compress(deltas.astype(dtype).tobytes(), 9)
    return {
        "shape": [int(input_dim), int(units)],
        "nnz": int(pattern.nnz),
        "encoding": encoding,
        "positions": base64.b64encode(packed).decode("ascii"),
    }


def decode(entry):
    """The ``SparsityPattern`` of a config entry written by ``encode``."""
    encoding = entry.get("encoding")
    if encoding not in (ENCODING, _ENCODING_64) or "positions" not in entry:
        raise invalid_value(
            "pattern", "a dict written by SparseDense.get_config (with shape, nnz, "
            "encoding and positions)", received=f"pattern={_summary(entry)}")
    dtype = "<u8" if encoding == _ENCODING_64 else "<u4"
    deltas = np.frombuffer(zlib.decompress(base64.b64decode(entry["positions"])), dtype)
    keys = np.cumsum(deltas.astype(np.int64))
    input_dim, units = (int(s) for s in entry["shape"])
    if keys.size != int(entry["nnz"]):
        raise invalid_value("pattern", f'positions of {entry["nnz"]} nonzeros',
                            received=f"pattern with {keys.size} positions")
    return SparsityPattern(keys % input_dim, keys // input_dim, (input_dim, units))


def _summary(entry):
    if not isinstance(entry, dict):
        return repr(entry)
    return "{" + ", ".join(f"{k!r}: ..." if k == "positions" else f"{k!r}: {v!r}"
                           for k, v in entry.items()) + "}"
