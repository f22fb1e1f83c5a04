"""One worker's shard of a row-partitioned SparseDense layer, and the one rule.

The core of both partitioned executions: ``tfsparse.partition.distribute``
(one shard per Horovod rank) and ``PipelineStrategy``'s stages on a group of
devices (one shard per device). A partition gives every output neuron of a
layer to one worker; that worker's shard holds the neurons' fan-in weights
and biases and computes them from the inputs they reference (its
``LayerPlan``'s local inputs).

The rule, the same for both: a SparseDense layer is partitioned when it is
applied to 2-D inputs ``(batch, features)`` and has no regularizer, activity
regularizer or constraint (those act on the whole variable or output, which
no worker holds). An activation that acts on each neuron alone (Keras's
element-wise activations) is applied by every worker to its own neurons;
any other (softmax, a custom function) is applied to the assembled outputs
(``finish_outputs``), so a layer with one ends a run of partitioned layers.
"""

import dataclasses

import numpy as np
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul
from tfsparse.partition.plan import LayerPlan
from tfsparse.partition.plan import layer_plan

# Keras activations computed neuron by neuron (softmax is not: it normalises
# over the layer's outputs, which are split between the workers).
ELEMENTWISE_ACTIVATIONS = (
    "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "sigmoid",
    "hard_sigmoid", "tanh", "softplus", "softsign", "swish", "mish", "exponential",
)
# Options that act on the whole kernel, bias or output.
WHOLE_LAYER_OPTIONS = ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                       "kernel_constraint", "bias_constraint")


def activation_is_elementwise(activation):
    """Whether ``activation`` is one of Keras's element-wise activations.

    Compared by identity with ``keras.activations.get(name)``: a custom
    function counts as not element-wise (applied after the gather, which is
    exact for any function).
    """
    return any(activation is keras.activations.get(name)
               for name in ELEMENTWISE_ACTIVATIONS)


def unpartitionable_reason(layer):
    """Why ``layer`` cannot be row-partitioned, or None when it can.

    Example:
      >>> from tfsparse.layers import SparseDense
      >>> print(unpartitionable_reason(SparseDense(4, density=0.5)))
      None
      >>> unpartitionable_reason(SparseDense(4, density=0.5, bias_constraint="non_neg"))
      'its bias_constraint is set'
    """
    if not isinstance(layer, SparseDense):
        return f"it is a {type(layer).__name__}, not a SparseDense layer"
    rank = getattr(layer, "_input_rank", 2)  # known once built
    if rank != 2:
        return f"it is applied to {rank}-D inputs, not to 2-D inputs (batch, features)"
    for name in WHOLE_LAYER_OPTIONS:
        if getattr(layer, name, None) is not None:
            return f"its {name} is set"
    return None


def partitionable(layer):
    """Whether ``layer`` can be row-partitioned (``unpartitionable_reason`` is None)."""
    return unpartitionable_reason(layer) is None


def ends_run(layer):
    """Whether a partitioned ``layer``'s outputs must be assembled before its
    activation (a non-element-wise one): no partitioned layer can follow it
    without that gather."""
    return not activation_is_elementwise(layer.activation)


@dataclasses.dataclass(frozen=True)
class LayerShard:
    """One worker's part of one layer.

    Attributes:
      plan: the worker's ``LayerPlan`` (owned inputs and outputs, messages).
        ``plan.positions`` are the shard's values' indices in the layer's
        ``values``, ``plan.owned_outputs`` its biases' indices.
      pattern: the ``SparsityPattern`` of the shard's kernel
        ``(len(plan.local_inputs), len(plan.owned_outputs))``.
    """

    plan: LayerPlan
    pattern: SparsityPattern


def layer_shard(layer, input_owners, output_owners, rank, k):
    """Worker ``rank``'s shard of ``layer`` in a partition over ``k`` workers.

    Args:
      layer: a built SparseDense layer.
      input_owners, output_owners: the partition's owner arrays of the
        layer's inputs and outputs (``Partition.owners[l]``, ``[l + 1]``).
      rank: the worker.
      k: the number of workers.

    Returns:
      A ``LayerShard``.

    Example:
      >>> import scipy.sparse
      >>> from tfsparse.layers import SparseDense
      >>> layer = SparseDense(4, pattern=scipy.sparse.eye(4, format="csr"))
      >>> layer.build((None, 4))
      >>> shard = layer_shard(layer, [0, 0, 1, 1], [1, 0, 0, 1], 0, 2)
      >>> shard.plan.owned_outputs.tolist(), shard.plan.local_inputs.tolist()
      ([1, 2], [0, 1, 2])
    """
    plan = layer_plan(kernel_structure(layer), input_owners, output_owners, rank, k)
    kernel = plan.kernel
    cols = np.repeat(np.arange(kernel.shape[1]), np.diff(kernel.indptr))
    return LayerShard(plan, SparsityPattern(kernel.indices, cols, kernel.shape))


def kernel_structure(layer):
    """The layer's pattern as a CSC matrix, each entry its index in ``values`` + 1
    (explicit in every position, whatever the values are)."""
    pattern = layer.pattern
    return scipy.sparse.csc_matrix(
        (np.arange(1, pattern.nnz + 1, dtype=np.float64), (pattern.rows, pattern.cols)),
        shape=pattern.shape)


def shard_weights(layer, shard):
    """``(values, bias)`` of the shard's neurons read from the layer's variables
    (``bias`` None without one)."""
    values = tf.gather(layer.values, shard.plan.positions)
    bias = None if layer.bias is None else tf.gather(layer.bias, shard.plan.owned_outputs)
    return values, bias


def assemble(parts, indices, size):
    """Every shard's ``parts`` put back at their ``indices`` of a ``[size]`` vector
    (values at ``plan.positions``, biases at ``plan.owned_outputs``)."""
    index = tf.concat([tf.cast(i, tf.int64) for i in indices], axis=0)
    return tf.scatter_nd(index[:, None], tf.concat(parts, axis=0), [size])


def shard_outputs(shard, local, values, bias, activation):
    """The shard's neurons on its local input ``[batch, len(plan.local_inputs)]``.

    ``local @ kernel + bias``, then ``activation`` when it is element-wise
    (otherwise ``finish_outputs`` applies it to the assembled outputs).
    """
    dtype = local.dtype
    outputs = sparse_matmul(local, tf.cast(values, dtype), shard.pattern,
                            bias=None if bias is None else tf.cast(bias, dtype))
    return activation(outputs) if activation_is_elementwise(activation) else outputs


def finish_outputs(outputs, activation):
    """The layer's outputs from its assembled shard outputs ``[batch, units]``:
    ``activation`` applied here when it is not element-wise."""
    return outputs if activation_is_elementwise(activation) else activation(outputs)
