"""Group lasso regularisers for dense and sparse fully connected kernels."""

import math
import numbers

from tfsparse._keras import keras
from tfsparse._keras import serializable

import tensorflow as tf  # noqa: E402  (after tfsparse._keras selects Keras 2)
from tfsparse._validation import invalid_value  # noqa: E402
from tfsparse.regularizers import conv_norms  # noqa: E402
from tfsparse.regularizers import group_norms  # noqa: E402

_DENSE_KINDS = group_norms.GROUP_KINDS
_CONV_KINDS = conv_norms.CONV_KINDS


def _validate(l, groups, block_shape):
    if (
        isinstance(l, bool)
        or not isinstance(l, numbers.Real)
        or not math.isfinite(l)
        or l < 0
    ):
        raise invalid_value("l", "a finite non-negative float", l)
    kinds = (groups,) if isinstance(groups, str) else groups
    if (
        not isinstance(kinds, (tuple, list))
        or not kinds
        or not all(isinstance(kind, str) for kind in kinds)
        or len(set(kinds)) != len(kinds)
        or not (set(kinds) <= set(_DENSE_KINDS) or set(kinds) <= set(_CONV_KINDS))
    ):
        raise invalid_value(
            "groups",
            "'rows', 'columns', 'blocks' (Dense kernels), 'filters', 'channels', 'shapes', "
            "'blocks' (convolution kernels) or a sequence of distinct ones of one family such "
            "as ('rows', 'columns')",
            groups,
        )
    if "blocks" in kinds:
        if (
            not isinstance(block_shape, (tuple, list))
            or len(block_shape) != 2
            or any(
                isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1
                for b in block_shape
            )
        ):
            raise invalid_value(
                "block_shape", "a pair of positive integers (bh, bw) when groups include "
                "'blocks'", block_shape,
            )
    elif block_shape is not None:
        raise invalid_value(
            "block_shape", "None unless groups include 'blocks'",
            received=f"block_shape={block_shape!r} with groups={groups!r}",
        )
    block = None if block_shape is None else (int(block_shape[0]), int(block_shape[1]))
    return float(l), (kinds if isinstance(kinds, str) else tuple(kinds)), block


# Regularisers that hold a variable are AutoTrackable (not tf.Module): assigned
# to a layer attribute, they become a checkpoint dependency, so SavedModel
# export reaches their variable, without adding it to the layer's weights.
_Trackable = tf.__internal__.tracking.AutoTrackable


@serializable
class GroupLasso(keras.regularizers.Regularizer, _Trackable):
    """Group lasso ``l * sum_g ||w_g||_2`` over groups of a Dense or convolution kernel.

    Works as the ``kernel_regularizer`` of a ``Dense`` layer (called on the 2-D
    kernel), of a ``Conv1D``/``Conv2D``/``Conv3D`` layer (called on its kernel
    ``(*spatial, in_channels, filters)``, with SSL's conv groups, see
    :mod:`tfsparse.regularizers.conv_norms`) and of a ``SparseDense`` layer (which calls
    :meth:`sparse_penalty` with its nonzero values and pattern; the groups are
    then formed over the nonzeros, never densified), and as a plain callable.

    With several kinds of groups (``groups=("rows", "columns")``) the penalty
    is the sum of the group lasso of each kind, each with strength ``l``: the
    SSL objective with both penalties in one object. Regularisers also add up:
    ``GroupLasso(1e-3, "rows") + GroupLasso(2e-3, "columns")``.

    The strength lives in a non-trainable ``tf.Variable`` (attribute
    ``strength``, starting at ``l``) read on every call, so a callback can switch the
    penalty off in the middle of ``model.fit`` (``strength.assign(0.0)``) without
    retracing the compiled training step.

    Args:
        l: the penalty strength, a float >= 0.
        groups: for Dense/SparseDense kernels ``"rows"`` (one input neuron's
            fan-out), ``"columns"`` (one output neuron's fan-in); for
            convolution kernels ``"filters"`` (one output channel's kernel),
            ``"channels"`` (one input channel across all filters), ``"shapes"``
            (one ``(*position, in_channel)`` across all filters); for both
            ``"blocks"`` (``block_shape`` tiles of the kernel, or of a
            convolution kernel's im2col matrix); or a sequence of distinct
            kinds of one family.
        block_shape: ``(bh, bw)``, required when ``groups`` includes ``"blocks"``.

    Example:
        >>> reg = GroupLasso(0.5, groups="columns")
        >>> float(reg(tf.constant([[3.0, 0.0], [4.0, 0.0]])))
        2.5
    """

    def __init__(self, l=0.01, groups="columns", block_shape=None):
        self.l, self.groups, self.block_shape = _validate(l, groups, block_shape)
        with tf.init_scope():  # a variable even when built inside a tf.function
            self.strength = tf.Variable(
                self.l, trainable=False, dtype=tf.float32, name="group_lasso_strength"
            )

    @property
    def kinds(self):
        """The kinds of groups as a tuple, e.g. ``("rows", "columns")``."""
        return (self.groups,) if isinstance(self.groups, str) else self.groups

    def __call__(self, x):
        x = tf.convert_to_tensor(x)
        if not x.dtype.is_floating:
            raise invalid_value("x", "a floating-point kernel",
                                received=f"x of dtype {x.dtype.name}")
        rank = x.shape.rank
        conv = set(self.kinds) <= set(_CONV_KINDS) and not set(self.kinds) <= set(_DENSE_KINDS)
        if rank == 2 and not conv:
            norms = group_norms.dense_group_norms
        elif rank is not None and 3 <= rank <= 5 and set(self.kinds) <= set(_CONV_KINDS):
            norms = conv_norms.conv_group_norms
        else:
            raise invalid_value(
                "x", "the 2-D kernel (input_dim, units) of a dense layer for groups 'rows', "
                "'columns', 'blocks', or a convolution kernel (*spatial, in_channels, filters) "
                "for groups 'filters', 'channels', 'shapes', 'blocks'; for a sparse kernel call "
                "sparse_penalty(values, pattern)",
                received=f"x with shape {x.shape} and groups={self.groups!r}"
            )
        total = tf.add_n(
            [tf.reduce_sum(norms(x, kind, self.block_shape)) for kind in self.kinds])
        return tf.cast(self.strength, x.dtype) * total

    def sparse_penalty(self, values, pattern):
        """The penalty of a sparse kernel given by its nonzeros.

        Args:
            values: float tensor (nnz,), in the pattern's order.
            pattern: an object with ``rows``, ``cols`` (int arrays) and
                ``shape`` ``(input_dim, units)``, e.g. a ``SparsityPattern``.

        Returns:
            A scalar tensor.
        """
        values = tf.convert_to_tensor(values)
        if not set(self.kinds) <= set(_DENSE_KINDS):
            raise invalid_value(
                "groups", "'rows', 'columns' or 'blocks' for the kernel of a SparseDense layer",
                self.groups)
        total = tf.add_n(
            [tf.reduce_sum(group_norms.sparse_group_norms(
                values, pattern.rows, pattern.cols, pattern.shape, kind, self.block_shape))
             for kind in self.kinds]
        )
        return tf.cast(self.strength, values.dtype) * total

    def __add__(self, other):
        return RegularizerSum([self, other])

    def __radd__(self, other):
        if isinstance(other, numbers.Number) and other == 0:  # so sum([...]) works
            return self
        return RegularizerSum([other, self])

    def get_config(self):
        groups = self.groups if isinstance(self.groups, str) else list(self.groups)
        block = None if self.block_shape is None else list(self.block_shape)
        return {"l": self.l, "groups": groups, "block_shape": block}


@serializable
class RegularizerSum(keras.regularizers.Regularizer, _Trackable):
    """The sum of several regularisers, usable on dense and sparse kernels.

    On a sparse kernel each term's ``sparse_penalty(values, pattern)`` is used
    when it has one, otherwise the term is called on the values vector (so
    ``keras.regularizers.L2`` adds weight decay of the nonzeros).

    Args:
        regularizers: a non-empty list of regularisers (callables with
            ``get_config``); nested sums are flattened.

    Example:
        >>> total = GroupLasso(1.0, "rows") + GroupLasso(1.0, "columns")
        >>> float(total(tf.constant([[3.0, 4.0]])))
        12.0
    """

    def __init__(self, regularizers):
        terms = []
        for reg in regularizers or ():
            if isinstance(reg, dict):
                reg = keras.regularizers.deserialize(reg)
            if not callable(reg):
                raise invalid_value("regularizers", "a list of regularizers",
                                    received=f"an element {reg!r}")
            terms.extend(reg.regularizers if isinstance(reg, RegularizerSum) else [reg])
        if not terms:
            raise invalid_value("regularizers", "a non-empty list of regularizers",
                                regularizers)
        self.regularizers = terms  # a tracked list: its terms' variables stay reachable

    def __call__(self, x):
        return tf.add_n([reg(x) for reg in self.regularizers])

    def sparse_penalty(self, values, pattern):
        """Sum of the terms' penalties of a sparse kernel (see :class:`GroupLasso`)."""
        terms = []
        for reg in self.regularizers:
            if hasattr(reg, "sparse_penalty"):
                terms.append(reg.sparse_penalty(values, pattern))
            else:
                terms.append(reg(values))
        return tf.add_n(terms)

    def __add__(self, other):
        return RegularizerSum([self, other])

    def __radd__(self, other):
        if isinstance(other, numbers.Number) and other == 0:
            return self
        return RegularizerSum([other, self])

    def get_config(self):
        return {"regularizers": [keras.regularizers.serialize(r) for r in self.regularizers]}


def without_group_lasso(regularizer):
    """The regulariser with its :class:`GroupLasso` terms removed (None if nothing is left).

    Example:
        >>> rest = without_group_lasso(GroupLasso(1.0) + keras.regularizers.L2(0.1))
        >>> type(rest).__name__
        'L2'
    """
    if isinstance(regularizer, GroupLasso):
        return None
    if isinstance(regularizer, RegularizerSum):
        rest = [r for r in regularizer.regularizers if not isinstance(r, GroupLasso)]
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else RegularizerSum(rest)
    return regularizer


def group_lasso_terms(regularizer):
    """The :class:`GroupLasso` terms inside a regulariser (itself, or a sum's terms).

    Args:
        regularizer: any regulariser or None.

    Returns:
        A list of the :class:`GroupLasso` objects it contains.

    Example:
        >>> len(group_lasso_terms(GroupLasso(1.0) + keras.regularizers.L2(0.1)))
        1
    """
    if isinstance(regularizer, GroupLasso):
        return [regularizer]
    if isinstance(regularizer, RegularizerSum):
        return [r for r in regularizer.regularizers if isinstance(r, GroupLasso)]
    return []
