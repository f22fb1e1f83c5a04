"""One drop-and-grow update of a SparseDense or SparseConv2D layer, with its optimizer state."""

import sys

import numpy as np
import tensorflow as tf

from tfsparse.dynamic import _optimizer_state
from tfsparse.dynamic import selection
from tfsparse.ops import SparsityPattern


def drop_and_grow(layer, fraction, grow, optimizer=None, agree=None):
    """Moves ``floor(fraction * nnz)`` of ``layer``'s nonzeros; nnz stays.

    Drops the smallest-magnitude weights (``selection.kept_after_drop``),
    then grows as many positions chosen by ``grow`` among those not kept (a
    weight just dropped may grow back: it then keeps its value, as in RigL).
    Surviving weights keep their values and optimizer state; grown ones
    start at 0 with the state of a weight never stepped (zero optimizer
    slots, but Adagrad's and Ftrl's accumulators at their
    ``initial_accumulator_value``; zero error-feedback residuals and gradient
    sums); dropped ones lose theirs. The layer's pattern stays sorted.

    Args:
      layer: a built ``SparseDense`` or ``SparseConv2D`` (its im2col kernel
        ``(kh * kw * cin, filters)`` moves as a SparseDense's kernel does).
      fraction: fraction of the nonzeros to move, in [0, 1].
      grow: ``f(taken_keys, count) -> sorted keys`` of the positions to grow.
      optimizer: the model's optimizer (its slots of ``layer.values`` move too).
      agree: optional ``f(keys) -> keys`` run on the new pattern's keys, e.g.
        a Horovod broadcast so every rank keeps the same pattern.

    Returns:
      The number of positions that are new (grown and not just dropped).

    Example:
      >>> import numpy as np
      >>> from tfsparse.layers import SparseDense
      >>> layer = SparseDense(4, density=0.5, seed=0)
      >>> _ = layer(np.ones((1, 8), "float32"))
      >>> rng = np.random.default_rng(0)
      >>> def grow(taken, count):
      ...     return selection.random_free_keys(rng, 32, count, taken)
      >>> moved = drop_and_grow(layer, 0.25, grow)
      >>> layer.nnz, moved <= 4
      (16, True)
    """
    shape, nnz = matrix_shape(layer), layer.nnz
    input_dim = shape[0]
    # The layer's own sorted pattern: read as is (layer.pattern would check it again).
    old_keys = selection.keys_of(layer.pattern_rows.numpy(), layer.pattern_cols.numpy(),
                                 input_dim)
    # As RigL: n_prune = floor(fraction * nnz), of the decimal product: in
    # binary 0.29 * 100 is 28.999999999999996, which moved 28, not 29.
    count = int(np.floor(round(fraction * nnz, 9)))
    if count == 0:
        return 0
    values = layer.values.numpy()
    kept, dropped = selection.split_by_magnitude(values, count)
    new_keys, source = selection.merge_kept_and_grown(
        old_keys, kept, dropped, grow(old_keys[kept], count))
    if agree is not None:
        agreed = np.asarray(agree(new_keys), np.int64)
        if not np.array_equal(agreed, new_keys):  # another rank's choice
            new_keys, source = agreed, selection.new_order(old_keys, agreed)
    if new_keys.size != nnz or np.any(np.diff(new_keys) <= 0):
        raise RuntimeError("A pattern update must keep nnz distinct positions.")
    taken_from, new = np.maximum(source, 0), np.flatnonzero(source < 0)

    def moved(array, fresh=0):  # one gather, then `fresh` at the new positions
        array = array[taken_from]
        array[new] = fresh
        return array

    states = _optimizer_state.position_state(optimizer, layer.values)
    cols, rows = np.divmod(new_keys, input_dim)
    layer.set_pattern(SparsityPattern(rows, cols, shape), moved(values))
    for state in states:
        state.assign(moved(state.numpy(),
                           _optimizer_state.fresh_value(optimizer, layer.values, state)))
    return int(new.size)


def check_optimizer(optimizer):
    """Raises ``NotImplementedError`` unless ``optimizer``'s state can follow moving positions.

    ``drop_and_grow`` finds out at the first update; a callback checks
    before training instead (Adafactor's factored statistics cannot move).

    Example:
      >>> from tfsparse._keras import keras
      >>> check_optimizer(keras.optimizers.Adam())
    """
    _optimizer_state.check_moves_with_positions(optimizer)


def matrix_shape(layer):
    """The shape of the sparse matrix a layer's pattern indexes (keys ``col * rows + row``).

    ``(input_dim, units)`` for a ``SparseDense``, the im2col kernel
    ``(kh * kw * cin, filters)`` for a ``SparseConv2D``.
    """
    from tfsparse.layers import SparseConv2D

    if isinstance(layer, SparseConv2D):
        return layer.im2col_shape
    return (layer.input_dim, layer.units)


def active_horovod():
    """``horovod.tensorflow`` when initialized with more than one process, else None."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() and hvd.size() > 1 else None
    except ValueError:
        return None


def horovod_agreement(hvd, name):
    """The ``agree`` and ``average`` functions of one layer's update under Horovod.

    Grow scores are averaged over the ranks block by block (``hvd.allreduce``);
    rank 0's new keys are then broadcast, so every rank holds the same pattern
    even where floating-point sums differ in the last bit.
    """

    def agree(keys):
        return hvd.broadcast(tf.constant(keys, tf.int64), 0, name=f"{name}_keys").numpy()

    def average(block, start):
        return hvd.allreduce(block, op=hvd.Average, name=f"{name}_grad_{start}")

    return agree, average
