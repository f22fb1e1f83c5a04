"""The compressor contract that every gradient compressor follows.

A compressor turns a 1-D float tensor into the pair ``(values, indices)``:
the kept values and their int32 positions. ``decompress(values, indices, size)``
rebuilds the dense 1-D tensor (zeros elsewhere; duplicate indices add up, so
the concatenated payloads of several workers decompress to their sum). Both run
inside ``tf.function`` and on any device. Everything above this contract (error
feedback, the Horovod optimizer) knows nothing else about a compressor.
"""

import math

import tensorflow as tf

from tfsparse import _validation

INDEX_DTYPE = tf.int32
_MAX_INT32 = 2**31 - 1


class Compressor(tf.Module):
    """Base class of the gradient compressors.

    Subclasses implement `_compress(flat)`; the base class checks the input,
    and provides `decompress`, `target_count`, `get_config`/`from_config` and
    `clone`. State that changes while training (adaptive stages, random
    counters) lives in `tf.Variable`s created in `__init__`, so it works in
    graph mode and is saved with TensorFlow checkpoints; build compressors
    outside `tf.function`.

    Args:
        ratio: fraction of the elements to keep, a float in (0, 1].
        name: optional name of the module.

    Example:
        >>> import tensorflow as tf
        >>> from tfsparse.compression import TopK
        >>> compressor = TopK(0.5)
        >>> values, indices = compressor.compress(tf.constant([0.1, -2.0, 0.3, 4.0]))
        >>> compressor.decompress(values, indices, 4).numpy().tolist()
        [0.0, -2.0, 0.0, 4.0]
    """

    #: True for compressors that send every element (the optimizer then uses a
    #: dense allreduce instead of an allgather of values and indices).
    sends_dense = False

    def __init__(self, ratio, name=None):
        super().__init__(name=name)
        self._ratio = _validation.check_fraction("ratio", ratio)
        self._given_name = name

    @property
    def ratio(self):
        """The target fraction of elements kept (a Python float)."""
        return self._ratio

    def compress(self, flat):
        """Selects the elements of a 1-D float tensor to send.

        Args:
            flat: 1-D floating-point tensor of finite values: NaN or Inf is
                an `InvalidArgumentError` (a threshold or a top-k has no
                meaning for them; `ErrorFeedback(..., nonfinite="skip")`
                sends nothing for such a gradient instead).

        Returns:
            `(values, indices)`: 1-D tensors of the kept values (dtype of
            `flat`) and their positions (int32), of equal length.
        """
        return self._compress_finite(tf.debugging.check_numerics(
            self._checked(flat), "Compressors take finite values; this tensor holds NaN or Inf"))

    def _compress_finite(self, flat):
        """`compress` for a caller that has checked or replaced non-finite values itself."""
        values, indices = self._compress(self._checked(flat))
        return values, tf.cast(indices, INDEX_DTYPE)

    def _checked(self, flat):
        """``flat`` as a tensor, once its rank, dtype and size are checked."""
        flat = tf.convert_to_tensor(flat)
        if flat.shape.rank != 1:
            raise ValueError(
                "Compressors take a 1-D tensor (flatten gradients first). "
                f"Received a tensor of shape {flat.shape}"
            )
        if not flat.dtype.is_floating:
            raise ValueError(
                f"Compressors take a floating-point tensor. Received dtype {flat.dtype.name}"
            )
        size = flat.shape[0]
        if size is not None and size > _MAX_INT32:
            raise ValueError(
                f"Compressors index with int32; a tensor of {size} elements is too large. "
                "Split it into parts of fewer than 2**31 elements."
            )
        return flat

    def _compress(self, flat):
        raise NotImplementedError

    def decompress(self, values, indices, size):
        """Rebuilds the dense 1-D tensor of `size` elements; duplicates add up."""
        indices = tf.cast(indices, INDEX_DTYPE)
        size = tf.cast(size, INDEX_DTYPE)
        return tf.scatter_nd(tf.expand_dims(indices, 1), values, tf.reshape(size, [1]))

    def target_count(self, size):
        """The number of elements the ratio asks for: max(1, round(ratio * size))."""
        return target_count(size, self._ratio)

    def get_config(self):
        """Returns the constructor arguments, so `from_config` rebuilds an equal
        compressor (its ``name`` too, when one was given)."""
        config = {"ratio": self._ratio}
        if self._given_name is not None:
            config["name"] = self._given_name
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def clone(self):
        """A new compressor with the same settings and fresh state."""
        return type(self).from_config(self.get_config())

    def __repr__(self):
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def target_count(size, ratio):
    """max(1, round(ratio * size)) as an int32 tensor (0 for an empty tensor)."""
    size = tf.cast(size, tf.float64)
    count = tf.maximum(tf.round(size * ratio), tf.minimum(size, 1.0))
    return tf.cast(count, INDEX_DTYPE)


def selection_block(ratio):
    """Block size for `select_above` when about `ratio` of the elements pass (1: none).

    With few survivors, a max over blocks of 16-64 elements finds the few
    blocks worth searching; ``tf.where`` then scans 1/block of the mask. At
    ratios above ~0.25% most blocks hold a survivor and blocking costs more.
    """
    block = 2 ** int(math.floor(math.log2(0.04 / ratio))) if ratio > 0 else 1
    return min(block, 64) if block >= 16 else 1


def _positions_above(magnitudes, threshold):
    return tf.cast(tf.reshape(tf.where(magnitudes > threshold), [-1]), INDEX_DTYPE)


def _blocked_positions_above(magnitudes, threshold, block):
    size = tf.size(magnitudes, out_type=INDEX_DTYPE)
    whole = size // block * block
    blocks = tf.reshape(magnitudes[:whole], [-1, block])
    candidates = _positions_above(tf.reduce_max(blocks, axis=1), threshold)
    inner = tf.cast(tf.where(tf.gather(blocks, candidates) > threshold), INDEX_DTYPE)
    head = tf.gather(candidates, inner[:, 0]) * block + inner[:, 1]
    tail = _positions_above(magnitudes[whole:], threshold) + whole
    return tf.concat([head, tail], 0)


def select_above(magnitudes, threshold, block=1):
    """Positions (int32, ascending) with `magnitudes > threshold`; at least one if any is nonzero.

    When the threshold leaves nothing but the tensor is not all zero, the
    position of the largest magnitude is returned, so a tensor smaller than
    `1 / ratio` still sends one element. An all-zero tensor sends nothing.
    ``block > 1`` searches block maxima first (same result, faster when few
    pass; see `selection_block`).
    """
    if block > 1:
        indices = _blocked_positions_above(magnitudes, threshold, block)
    else:
        indices = _positions_above(magnitudes, threshold)

    def largest():
        position = tf.cast(tf.argmax(magnitudes, output_type=tf.int64), INDEX_DTYPE)
        keep = tf.reduce_max(magnitudes) > 0
        return tf.cond(
            keep,
            lambda: tf.reshape(position, [1]),
            lambda: tf.zeros([0], INDEX_DTYPE),
        )

    none_selected = tf.logical_and(tf.equal(tf.size(indices), 0), tf.size(magnitudes) > 0)
    return tf.cond(none_selected, largest, lambda: indices)
