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
every rank and each keeps its own slice (no communication). Each rank
applies element-wise activations to its own neurons; a last layer's
non-element-wise activation (softmax) is applied after the gather, to whole
rows (the rule of ``tfsparse.partition.shards``, which PipelineStrategy's
partitioned stages follow too). A plain
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

import hashlib

import numpy as np
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._model_chain import chain_layers
from tfsparse._validation import invalid_value
from tfsparse.partition.shards import assemble
from tfsparse.partition.shards import ends_run
from tfsparse.partition.shards import finish_outputs
from tfsparse.partition.shards import layer_shard
from tfsparse.partition.shards import shard_outputs
from tfsparse.partition.shards import shard_weights
from tfsparse.partition.shards import unpartitionable_reason


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
    if name is None:
        received, received_splits = hvd.alltoall(buffer, splits=splits)
    else:
        received, received_splits = _named_alltoall(hvd, buffer, splits, name)
    local = tf.concat([owned, tf.transpose(received)], axis=1)
    return local, received_splits


def _named_alltoall(hvd, buffer, splits, name):
    """``hvd.alltoall`` named ``name`` (its gradient, the reverse alltoall,
    ``name + "_grad"``), whatever the graph's scopes: Horovod pairs the ranks'
    collectives by name, and names taken from Keras's layer and model names
    can differ between ranks (so the ranks waited on each other forever)."""

    @tf.custom_gradient
    def alltoall(buffer):
        received, received_splits = hvd.alltoall(buffer, splits=splits, name=name,
                                                 ignore_name_scope=True)

        def gradient(upstream, _):
            back, _ = hvd.alltoall(upstream, splits=received_splits, name=f"{name}_grad",
                                   ignore_name_scope=True)
            return back

        return (received, received_splits), gradient

    return alltoall(buffer)


class PartitionedSparseDense(keras.layers.Layer):
    """One rank's shard of a SparseDense layer: its owned outputs only.

    Takes ``[batch, owned inputs]`` (or, for a first layer without input
    exchange, the whole ``[batch, n_in]``) and returns ``[batch, owned
    outputs]``, activated when the activation is element-wise (see
    ``tfsparse.partition.shards``). Built by ``distribute``, which copies
    the rank's weights into it; not serialisable (save the model
    ``collect_weights`` fills instead).

    Args:
        shard: this rank's ``LayerShard``.
        activation: the Keras activation of the layer.
        use_bias: whether the layer has a bias.
        exchange_inputs: False to read the local inputs from a full input
            (no communication), True to receive them with ``exchange``.
        collective_name: the Horovod name of its exchange, the same on
            every rank (``distribute`` numbers them by layer); None: Horovod
            names it from the graph, which every rank must then build alike.
    """

    def __init__(self, shard, activation=None, use_bias=True,
                 exchange_inputs=True, collective_name=None, **kwargs):
        super().__init__(**kwargs)
        self.shard = shard
        self.collective_name = collective_name
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.exchange_inputs = exchange_inputs

    @property
    def plan(self):
        """This rank's ``LayerPlan`` of the layer."""
        return self.shard.plan

    def build(self, input_shape):
        self.values = self.add_weight(
            "values", shape=(self.plan.kernel.nnz,), trainable=True,
            initializer="zeros")
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                "bias", shape=(self.plan.owned_outputs.size,), trainable=True,
                initializer="zeros")
        self.built = True

    def call(self, inputs):
        if self.exchange_inputs:
            local, _ = exchange(inputs, self.plan, name=self.collective_name)
        else:
            local = tf.gather(inputs, self.plan.local_inputs, axis=1)
        return shard_outputs(self.shard, local, self.values, self.bias,
                             self.activation)


class GatherOutputs(keras.layers.Layer):
    """Assembles every rank's owned outputs into the full output, on every rank.

    Forward: one ``hvd.allgather``, then the last layer's activation if it is
    not element-wise (``finish_outputs``: softmax sees the whole row).
    Backward: the loss is the same on every rank, so the gradient of the
    full output (before that activation too) is, and each rank keeps the
    columns of its own outputs; no communication.

    Args:
        owned_outputs_per_rank: list of ``k`` index arrays (rank order).
        rank: this rank.
        activation: the last layer's Keras activation.
    """

    def __init__(self, owned_outputs_per_rank, rank, activation=None, **kwargs):
        super().__init__(**kwargs)
        order = np.concatenate(owned_outputs_per_rank)
        self._inverse = np.argsort(order).astype(np.int32)
        self._own = np.asarray(owned_outputs_per_rank[rank], dtype=np.int32)
        self.activation = keras.activations.get(activation)

    def call(self, inputs):
        hvd = _horovod()
        inverse, own = self._inverse, self._own

        @tf.custom_gradient
        def gather(owned):
            gathered = hvd.allgather(tf.transpose(owned), name="tfsparse_gather_outputs",
                                     ignore_name_scope=True)
            full = tf.transpose(tf.gather(gathered, inverse))

            def grad(upstream):
                return tf.gather(upstream, own, axis=1)

            return full, grad

        return finish_outputs(gather(inputs), self.activation)


class PartitionedModel(keras.Model):
    """The model ``distribute`` returns: a functional Keras model whose
    ``compile`` refuses what the ranks cannot compute as the whole model
    would.

    ``clipnorm`` and ``global_clipnorm`` would clip each rank's shard of a
    layer's weights by the norm of that shard alone (the whole model's
    norm is over every shard), and a ``LossScaleOptimizer`` would judge
    overflows, and so its scale, on each rank alone.
    """

    def compile(self, optimizer="rmsprop", *args, **kwargs):
        optimizer = keras.optimizers.get(optimizer)
        settings = [name for name in ("clipnorm", "global_clipnorm")
                    if getattr(optimizer, name, None) is not None]
        if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
            settings.append("loss scaling (LossScaleOptimizer)")
        if settings:
            raise invalid_value(
                "optimizer", "an optimizer without clipnorm, global_clipnorm or loss "
                "scaling (each rank would clip or scale by its own shard's gradients, not "
                "the whole model's; clipvalue is element-wise and works)",
                received=f"{type(optimizer).__name__} with {', '.join(settings)}")
        return super().compile(optimizer, *args, **kwargs)


@tf.custom_gradient
def _input_gradient_summed_over_ranks(inputs):
    def gradient(upstream):
        return _horovod().allreduce(upstream, op=_horovod().Sum,
                                    name="tfsparse_partition_input_gradient",
                                    ignore_name_scope=True)

    return tf.identity(inputs), gradient


def _sparse_layers(model):
    """The model's layers, all SparseDense layers ``distribute`` computes exactly.

    Raises:
        ValueError: naming the first layer that is not (see
            ``tfsparse.partition.shards`` for the rule).
    """
    layers = chain_layers(model)
    for index, layer in enumerate(layers):
        if not layer.built:
            raise invalid_value("model", "a built model (its layers' shapes are known "
                                "once built: call it on a batch, or start it with an Input)",
                                received=f"layer {layer.name!r} not built")
        if layer.dtype_policy.name != "float32":
            # The shards compute in float32 (no float64 kernels, and one loss
            # scale per rank under mixed_float16 would differ between ranks).
            raise invalid_value("model", "float32 layers (dtype policy 'float32')",
                                received=f"layer {layer.name!r} with dtype policy "
                                f"{layer.dtype_policy.name!r}")
        reason = unpartitionable_reason(layer)
        if reason is not None:
            raise invalid_value(
                "model", "a chain of SparseDense layers on 2-D inputs without regularizers "
                "or constraints", received=f"layer {layer.name!r}: {reason}")
        if index < len(layers) - 1 and ends_run(layer):
            name = getattr(layer.activation, "__name__", repr(layer.activation))
            raise invalid_value(
                "model", "an activation that acts on each neuron alone in every layer but "
                "the last (whose activation, such as softmax, is applied after the outputs "
                "are gathered)", received=f"layer {layer.name!r} with activation {name}")
    return layers


def owners_digest(owners):
    """A digest of a partition's owners (one int array per level), to compare
    the ranks' partitions by one small message.

    Example:
      >>> owners_digest([np.array([0, 1, 1, 0])]) == owners_digest([np.array([1, 0, 0, 1])])
      False
    """
    digest = hashlib.blake2b(digest_size=16)
    for level in owners:
        digest.update(np.int64(np.size(level)).tobytes())
        digest.update(np.ascontiguousarray(level, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _check_partition(partition, sizes, hvd):
    if partition.k != hvd.size():
        raise invalid_value(
            "partition", f"a partition into hvd.size()={hvd.size()} parts",
            received=f"partition.k={partition.k}")
    if partition.sizes != sizes:
        raise invalid_value(
            "partition", f"one for a network with layer sizes {sizes}",
            received=f"partition.sizes={partition.sizes}")
    digests = hvd.allgather_object(owners_digest(partition.owners))
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
    batches on every rank (``shuffle=False`` or a common seed: nothing
    checks that the ranks' batches agree, and outputs gathered from
    different samples train the model wrongly).

    Args:
        model: a Keras model of SparseDense layers (``InputLayer`` allowed)
            on 2-D inputs, without regularizers or constraints, whose
            activations act on each neuron alone except perhaps the last
            layer's (softmax, say, is then applied after the gather).
        partition: a ``Partition`` of the model into ``hvd.size()`` parts.
        exchange_inputs: False (default): every rank reads the inputs of the
            first layer from the batch it has. True: each rank keeps only the
            inputs ``partition.owners[0]`` gives it and the first layer
            exchanges them like the others (for inputs that arrive split).

    Returns:
        A ``PartitionedModel`` (a functional ``keras.Model``): a ``Lambda``
        that sums the gradient of the inputs over the ranks (run only when
        something before the model needs it), the ``PartitionedSparseDense``
        layers and a final ``GatherOutputs``; ``collect_weights`` copies its
        weights back. Its ``compile`` refuses ``clipnorm``,
        ``global_clipnorm`` and loss scaling. Its collectives have fixed
        names: one distributed model per traced function (two in one
        ``fit`` fail with Horovod's error about tensors of the same name).

    Raises:
        ValueError: naming the argument, for a model that is not a built
            chain of float32 SparseDense layers (each called once, one
            input, one output), a partition of another network or size,
            other owners on another rank, or a rank that owns no neuron of
            some layer.

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
    policy = keras.mixed_precision.global_policy().name
    if policy != "float32":
        raise invalid_value("model", "distribute called under the float32 dtype policy "
                            "(the ranks' layers take the global policy)",
                            received=f"global policy {policy!r}")
    sizes = [layers[0].input_dim] + [layer.units for layer in layers]
    _check_partition(partition, sizes, hvd)
    rank, k = hvd.rank(), hvd.size()
    owners = partition.owners
    for level in range(1, len(owners)):
        # The same partition on every rank: every rank raises alike.
        owned = np.bincount(owners[level], minlength=k)
        if not owned.all():
            raise invalid_value(
                "partition", "every rank to own outputs in every layer",
                received=f"rank {int(np.argmin(owned))} owning none of layer "
                f"{layers[level - 1].name!r}'s {owners[level].size}")
    shards = [layer_shard(layer, owners[l], owners[l + 1], rank, k)
              for l, layer in enumerate(layers)]
    plans = [shard.plan for shard in shards]
    inputs = keras.Input((sizes[0],), dtype=layers[0].dtype)
    # Each rank's gradient of the inputs holds its own neurons' reads only:
    # summed over the ranks, the whole model's (computed only when something
    # before the model needs it).
    x = keras.layers.Lambda(_input_gradient_summed_over_ranks,
                            name="input_gradient_sum")(inputs)
    if exchange_inputs:
        x = keras.layers.Lambda(
            lambda t: tf.gather(t, plans[0].owned_inputs, axis=1))(x)
    distributed = []
    for index, (layer, shard) in enumerate(zip(layers, shards)):
        part = PartitionedSparseDense(
            shard, activation=layer.activation, use_bias=layer.use_bias,
            exchange_inputs=exchange_inputs or index > 0,
            collective_name=f"tfsparse_partition_exchange_{index}",
            name=f"{layer.name}_partitioned")
        x = part(x)
        values, bias = shard_weights(layer, shard)
        part.values.assign(values)
        if layer.use_bias:
            part.bias.assign(bias)
        distributed.append(part)
    owned_last = [np.flatnonzero(owners[-1] == r) for r in range(k)]
    outputs = GatherOutputs(owned_last, rank, activation=layers[-1].activation,
                            name="gather_outputs")(x)
    result = PartitionedModel(inputs, outputs, name=f"{model.name}_partitioned")
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
        layer.values.assign(assemble([values], [positions], layer.nnz))
        if layer.use_bias:
            owned = hvd.allgather(tf.constant(part.plan.owned_outputs))
            bias = hvd.allgather(tf.convert_to_tensor(part.bias))
            layer.bias.assign(assemble([bias], [owned], layer.units))
