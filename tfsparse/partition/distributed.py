"""Partitioned forward and backward passes over Horovod, usable from Keras.

``distribute(model, partition)`` turns a model of SparseDense layers into the
model this rank runs under ``horovodrun -np k``: each rank holds only the
fan-in weights (and biases) of the neurons it owns. Before each layer a rank
receives, with one ``hvd.alltoall`` with per-destination splits, exactly the
inputs its neurons read and it does not own; the backward pass of that
alltoall (Horovod's registered gradient, an alltoall with the received
splits) returns their gradients to the owners; weight gradients stay local.
The last layer's outputs are gathered on every rank (``hvd.allgather``) so
any Keras loss and metric apply; since every rank sees the same batch and
computes the same loss, the gradient of the gathered outputs is the same on
every rank and each keeps its own slice (no communication). A plain
optimizer (not ``hvd.DistributedOptimizer``) then updates the local weights:
the weights are split, not replicated.

Per sample and per layer, rank ``p`` sends ``partition.send[l, p]`` values in
the forward pass and as many in the backward pass; gathering the outputs
sends ``owned outputs * (k - 1)`` more. With ``exchange_inputs=False`` (the
default, every rank has the whole batch) the first layer reads its inputs
from the batch and sends nothing.

Example:
  >>> import horovod.tensorflow as hvd
  >>> import numpy as np
  >>> from tfsparse import SparseDense, keras
  >>> from tfsparse.partition import partition_rows
  >>> hvd.init()  # under horovodrun -np k, each rank runs this
  >>> model = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5, seed=0),
  ...                           SparseDense(4, density=0.5, seed=1)])
  >>> local = distribute(model, partition_rows(model, hvd.size(), "block"))
  >>> x = np.ones((2, 8), "float32")
  >>> np.allclose(local(x), model(x), atol=1e-6)
  True
"""

import numpy as np
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._validation import invalid_value
from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul
from tfsparse.partition.plan import network_plans


def _horovod():
    import horovod.tensorflow as hvd
    return hvd


def exchange(owned, plan, name=None):
    """Sends the owned values other ranks need; returns the local input.

    Args:
        owned: float tensor ``[batch, len(plan.owned_inputs)]``.
        plan: this rank's ``LayerPlan``.
        name: optional Horovod op name (must be the same on every rank).

    Returns:
        ``(local_inputs, received_splits)``: a tensor ``[batch,
        len(plan.local_inputs)]`` (owned values, then the received ones in
        rank order) and the int32 ``(k,)`` counts Horovod received from each
        rank, in values per sample (rows of the transposed message).
    """
    hvd = _horovod()
    send_index = tf.constant(np.concatenate(plan.send).astype(np.int32))
    buffer = tf.transpose(tf.gather(owned, send_index, axis=1))
    splits = tf.constant(plan.send_counts.astype(np.int32))
    received, received_splits = hvd.alltoall(buffer, splits=splits, name=name)
    local = tf.concat([owned, tf.transpose(received)], axis=1)
    return local, received_splits


def _local_pattern(kernel):
    """SparsityPattern of a sorted CSC matrix, explicit zeros included."""
    cols = np.repeat(np.arange(kernel.shape[1]), np.diff(kernel.indptr))
    return SparsityPattern(kernel.indices, cols, kernel.shape)


class PartitionedSparseDense(keras.layers.Layer):
    """One rank's share of a SparseDense layer: its owned outputs only.

    Takes ``[batch, owned inputs]`` (or, for a first layer without input
    exchange, the whole ``[batch, n_in]``) and returns ``[batch, owned
    outputs]``. Built by ``distribute``; not serialisable (save the model
    ``collect_weights`` fills instead).

    Args:
        plan: this rank's ``LayerPlan``.
        activation: Keras activation.
        use_bias: whether the layer has a bias.
        exchange_inputs: False to read the local inputs from a full input
            (no communication), True to receive them with ``exchange``.
    """

    def __init__(self, plan, activation=None, use_bias=True,
                 exchange_inputs=True, **kwargs):
        super().__init__(**kwargs)
        self.plan = plan
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.exchange_inputs = exchange_inputs
        self._pattern = _local_pattern(plan.kernel)

    def build(self, input_shape):
        kernel = self.plan.kernel
        self.values = self.add_weight(
            "values", shape=(kernel.nnz,), trainable=True,
            initializer=keras.initializers.Constant(kernel.data))
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                "bias", shape=(kernel.shape[1],), trainable=True,
                initializer="zeros")
        self.built = True

    def call(self, inputs):
        if self.exchange_inputs:
            local, _ = exchange(inputs, self.plan)
        else:
            local = tf.gather(inputs, self.plan.local_inputs, axis=1)
        return self.compute(local)

    def compute(self, local):
        """The owned outputs from the local input ``[batch, local inputs]``."""
        outputs = sparse_matmul(local, self.values, self._pattern)
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs


class GatherOutputs(keras.layers.Layer):
    """Assembles every rank's owned outputs into the full output, on every rank.

    Forward: one ``hvd.allgather``. Backward: the loss is the same on every
    rank, so the gradient of the full output is too, and each rank keeps the
    columns of its own outputs; no communication.

    Args:
        owned_outputs_per_rank: list of ``k`` index arrays (rank order).
        rank: this rank.
    """

    def __init__(self, owned_outputs_per_rank, rank, **kwargs):
        super().__init__(**kwargs)
        order = np.concatenate(owned_outputs_per_rank)
        self._inverse = np.argsort(order).astype(np.int32)
        self._own = np.asarray(owned_outputs_per_rank[rank], dtype=np.int32)

    def call(self, inputs):
        hvd = _horovod()
        inverse, own = self._inverse, self._own

        @tf.custom_gradient
        def gather(owned):
            gathered = hvd.allgather(tf.transpose(owned))
            full = tf.transpose(tf.gather(gathered, inverse))

            def grad(upstream):
                return tf.gather(upstream, own, axis=1)

            return full, grad

        return gather(inputs)


def _sparse_layers(model):
    layers = []
    for layer in model.layers:
        if hasattr(layer, "to_scipy"):
            for name in ("kernel_regularizer", "bias_regularizer",
                         "activity_regularizer", "kernel_constraint",
                         "bias_constraint"):
                if getattr(layer, name, None) is not None:
                    raise invalid_value(
                        "model", "SparseDense layers without regularizers or constraints",
                        received=f"layer {layer.name!r} with {name}")
            layers.append(layer)
        elif layer.weights:
            raise invalid_value(
                "model", "a model whose layers with weights are all SparseDense",
                received=f"layer {layer.name!r} of type {type(layer).__name__}")
        elif not isinstance(layer, keras.layers.InputLayer):
            raise invalid_value(
                "model", "only SparseDense layers in sequence",
                received=f"layer {layer.name!r} of type {type(layer).__name__}")
    return layers


def global_kernel(layer):
    """A SparseDense kernel as a sorted CSC matrix in the layer's value order."""
    pattern = layer.pattern
    kernel = scipy.sparse.csc_matrix(
        (layer.values.numpy(), (pattern.rows, pattern.cols)),
        shape=pattern.shape)
    kernel.sort_indices()
    return kernel


def _check_partition(partition, sizes, hvd):
    if partition.k != hvd.size():
        raise invalid_value(
            "partition", f"a partition into hvd.size()={hvd.size()} parts",
            received=f"partition.k={partition.k}")
    if partition.sizes != sizes:
        raise invalid_value(
            "partition", f"one for a network with layer sizes {sizes}",
            received=f"partition.sizes={partition.sizes}")
    digest = np.array([int(o @ np.arange(1, o.size + 1) % 1000003)
                       for o in partition.owners], dtype=np.int64)
    digests = hvd.allgather_object(digest.tolist())
    if any(d != digests[0] for d in digests):
        raise invalid_value(
            "partition", "the same partition on every rank (Mt-KaHyPar with several "
            "threads is not deterministic: partition on one rank and broadcast it, e.g. "
            "partition = hvd.broadcast_object(partition, root_rank=0))",
            received="different owners on different ranks")


def distribute(model, partition, exchange_inputs=False):
    """Returns this rank's partitioned version of a SparseDense model.

    Call it on every rank after ``hvd.init()``, with the same model weights
    and the same partition everywhere. The returned model maps the whole
    input batch ``[batch, n_0]`` to the whole output ``[batch, n_L]`` on
    every rank; compile it with a plain optimizer and fit it with the same
    batches on every rank (``shuffle=False`` or a common seed).

    Args:
        model: a Keras model of SparseDense layers (``InputLayer`` allowed),
            without regularizers or constraints.
        partition: a ``Partition`` of the model into ``hvd.size()`` parts.
        exchange_inputs: False (default): every rank reads the inputs of the
            first layer from the batch it has. True: each rank keeps only the
            inputs ``partition.owners[0]`` gives it and the first layer
            exchanges them like the others (for inputs that arrive split).

    Returns:
        A ``keras.Model`` whose layers are ``PartitionedSparseDense`` and a
        final ``GatherOutputs``; ``collect_weights`` copies its weights back.

    Example:
        >>> # under horovodrun -np 2, after hvd.init():
        >>> # part = hvd.broadcast_object(partition_rows(model, 2), 0)
        >>> # dist = distribute(model, part)
        >>> # dist.compile(keras.optimizers.SGD(0.1), "mse")
        >>> # dist.fit(x, y, shuffle=False)
        >>> # collect_weights(dist, model)
    """
    hvd = _horovod()
    layers = _sparse_layers(model)
    kernels = [global_kernel(layer) for layer in layers]
    sizes = [kernels[0].shape[0]] + [kernel.shape[1] for kernel in kernels]
    _check_partition(partition, sizes, hvd)
    rank, k = hvd.rank(), hvd.size()
    plans = network_plans(kernels, partition.owners, rank, k)
    if any(plan.owned_outputs.size == 0 for plan in plans):
        raise invalid_value(
            "partition", "every rank to own outputs in every layer",
            received=f"rank {rank} owns none in some layer")
    inputs = keras.Input((sizes[0],), dtype=layers[0].dtype)
    x = inputs
    if exchange_inputs:
        x = keras.layers.Lambda(
            lambda t: tf.gather(t, plans[0].owned_inputs, axis=1))(x)
    distributed = []
    for index, (layer, plan) in enumerate(zip(layers, plans)):
        part = PartitionedSparseDense(
            plan, activation=layer.activation, use_bias=layer.use_bias,
            exchange_inputs=exchange_inputs or index > 0,
            name=f"{layer.name}_partitioned")
        x = part(x)
        if layer.use_bias:
            part.bias.assign(tf.gather(layer.bias, plan.owned_outputs))
        distributed.append(part)
    owned_last = [np.flatnonzero(partition.owners[-1] == r) for r in range(k)]
    outputs = GatherOutputs(owned_last, rank, name="gather_outputs")(x)
    result = keras.Model(inputs, outputs, name=f"{model.name}_partitioned")
    result.partition_plans = plans
    result.partitioned_layers = distributed
    return result


def collect_weights(distributed, model):
    """Copies the trained weights of every rank into ``model`` on every rank.

    One ``hvd.allgather`` per variable; ``model`` is the SparseDense model
    ``distributed`` was built from.
    """
    hvd = _horovod()
    layers = _sparse_layers(model)
    for layer, part in zip(layers, distributed.partitioned_layers):
        positions = hvd.allgather(tf.constant(part.plan.positions))
        values = hvd.allgather(tf.convert_to_tensor(part.values))
        full = tf.scatter_nd(positions[:, None], values, layer.values.shape)
        layer.values.assign(full)
        if layer.use_bias:
            owned = hvd.allgather(tf.constant(part.plan.owned_outputs))
            bias = hvd.allgather(tf.convert_to_tensor(part.bias))
            layer.bias.assign(tf.scatter_nd(owned[:, None], bias,
                                            layer.bias.shape))
