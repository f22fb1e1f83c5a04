"""A stage on a group of devices: its SparseDense layers row-partitioned over it.

``PipelineStrategy(devices=[["/gpu:0", "/gpu:1"], "/gpu:2"])`` gives stage
0 two devices. Each run of consecutive SparseDense layers of such a stage
that can be partitioned (the rule of ``tfsparse.partition.shards``, shared
with ``tfsparse.partition.distribute``; a layer with a non-element-wise
activation such as softmax ends a run) is partitioned with
``tfsparse.partition.partition_rows(kernels, k=len(group))``: device ``p``
owns the output neurons ``owners[l][j] == p`` of every layer of the run and
holds their fan-in weights and biases (its ``LayerShard``s). In the
forward pass device ``p`` computes only its neurons, from the inputs they
reference: for the run's first layer those entries of the stage's input (on
the group's first device, where the previous stage's activation arrives);
for a later layer its own outputs of the layer before and, from every other
device ``q``, the entries of ``q``'s outputs its neurons reference and it
does not own, in the order of ``tfsparse.partition.plan.layer_plan``. So
the words moved per sample before a later layer are exactly the
partition's ``send[l].sum()``. The run's output is assembled on the first
device, which applies the last layer's activation there when it is not
element-wise. The backward pass is the transposed exchange, written out per
device (each device differentiates its own neurons with its own tape, so
every gradient op runs where its data is): activation gradients go back to
the owners of the inputs, where they are summed; weight gradients stay on
the device of their neurons, and so do their accumulation and update (one
copy of the optimizer per device).

Where the weights live: the Keras layer keeps its one ``values`` (and
``bias``) variable, so ``model.save``, checkpoints, ``get_weights`` and
``evaluate``/``predict`` see one ordinary model. Each device holds shard
variables of its neurons' values and biases, which the stage trains. A
training window (``steps_per_execution`` steps, one graph) starts by
gathering the shards from the layer's variables and ends by scattering
them back. Cost: per window and per layer, every value and bias is copied
twice (layer variable to shards and back, moving about ``nnz`` words to and
from the group's devices), small next to the window's ``2 * 3 * nnz *
rows`` multiply-adds; and the shards and their optimizer slots are a second
copy of the partitioned layers' weights in memory. Writes to the layer's
variables between windows (``set_weights``, loading weights, callbacks)
are picked up by the next window; writes from inside a window are not
(nothing else writes them there). A pattern other than the one the
shards were cut from raises there (its fingerprint is checked where the
weights are read): the shards would read its values at the old positions.

``evaluate`` and ``predict`` run the same partitioned forward (``infer``:
same placement, same exchange, no tape) but read the layer's variables,
not the shards: each call gathers every device's values and biases from
them (about ``nnz`` words per layer per batch), so inference always sees
the weights ``get_weights`` shows, with nothing to keep in sync.
"""

import logging

import numpy as np
import tensorflow as tf

from tfsparse._validation import invalid_value as invalid
from tfsparse.layers import SparseDense
from tfsparse.partition import METHODS
from tfsparse.partition import Partition
from tfsparse.partition import partition_rows
from tfsparse.partition.shards import assemble
from tfsparse.partition.shards import ends_run
from tfsparse.partition.shards import finish_outputs
from tfsparse.partition.shards import kernel_structure
from tfsparse.partition.shards import layer_shard
from tfsparse.partition.shards import shard_outputs
from tfsparse.partition.shards import shard_weights
from tfsparse.partition.shards import unpartitionable_reason

DEFAULT_METHOD = "hypergraph"
_logger = logging.getLogger("tfsparse")


def check_partition_argument(partition, device_groups):
    """Validates ``PipelineStrategy``'s ``partition``; returns one entry per stage.

    An entry is None (a stage on one device), a method name, or a tuple of
    ``Partition`` (one per run of consecutive SparseDense layers).
    """
    num_stages = len(device_groups)
    grouped = [s for s, group in enumerate(device_groups) if len(group) > 1]
    expected = (f"a method ({', '.join(repr(m) for m in METHODS)}), a Partition "
                f"(with one stage on a group of devices), or a list with one entry "
                f"per stage ({num_stages}): None, a method, a Partition or a list of "
                f"Partitions for a stage on a group of devices, None for the others")
    received = partition
    if isinstance(partition, str) and partition in METHODS:
        return [partition if s in grouped else None for s in range(num_stages)]
    if isinstance(partition, Partition) and len(grouped) == 1:
        entries = [None] * num_stages
        entries[grouped[0]] = (partition,)
        partition = entries
    if not isinstance(partition, (list, tuple)) or len(partition) != num_stages:
        raise invalid("partition", expected, received)
    entries = []
    for s, (entry, group) in enumerate(zip(partition, device_groups)):
        if entry is None:
            entries.append(DEFAULT_METHOD if s in grouped else None)
            continue
        if s not in grouped:
            raise invalid("partition", expected, received)
        if isinstance(entry, str) and entry in METHODS:
            entries.append(entry)
            continue
        parts = (entry,) if isinstance(entry, Partition) else entry
        if (not isinstance(parts, (list, tuple)) or not parts
                or not all(isinstance(p, Partition) for p in parts)):
            raise invalid("partition", expected, received)
        for part in parts:
            if part.k != len(group):
                raise invalid("partition", f"Partitions into {len(group)} parts for "
                              f"stage {s} (its group of devices)", received)
        entries.append(tuple(parts))
    return entries


def find_runs(layers, stages, device_groups, devices_received, only_stage=None):
    """Per grouped stage the runs of consecutive partitionable layers: maximal,
    except that a layer with a non-element-wise activation ends its run (its
    activation is applied to the run's assembled output).

    Args:
      only_stage: None, or the one stage to look at (a Horovod process runs
        only its own stage, and every stage has the process's group of
        ``local_devices``: a stage without layers to partition then simply
        runs on the group's first device).

    Returns:
      A list of ``(stage, layer indices)``.

    Raises:
      ValueError: for a group of devices on a stage with no layer to
        partition (``only_stage`` None).
    """
    runs = []
    for s, (group, devices) in enumerate(zip(stages, device_groups)):
        if len(devices) == 1 or only_stage not in (None, s):
            continue
        found, current = [], []
        for index in group:
            reason = unpartitionable_reason(layers[index])
            if reason is None:
                current.append(index)
                if not ends_run(layers[index]):
                    continue
            elif isinstance(layers[index], SparseDense):
                _logger.warning(
                    "tfsparse: SparseDense layer %r of stage %d runs unpartitioned on %s: %s.",
                    layers[index].name, s, devices[0], reason)
            if current:
                found.append(tuple(current))
                current = []
        if current:
            found.append(tuple(current))
        if not found and only_stage is None:
            names = ", ".join(layers[i].name for i in group) or "no layer"
            raise invalid("devices", "a group of devices only for a stage with SparseDense "
                          "layers to partition (on 2-D inputs, without regularizers or "
                          f"constraints); stage {s} has {names}", devices_received)
        runs += [(s, run) for run in found]
    return runs


def run_partitions(runs, layers, entries, devices_received, device_groups):
    """One ``Partition`` per run: the given ones, or ``partition_rows``'s."""
    by_stage = {}
    for stage, run in runs:
        by_stage.setdefault(stage, []).append(run)
    result = []
    for stage, run in runs:
        entry, k = entries[stage], len(device_groups[stage])
        kernels = [kernel_structure(layers[i]) for i in run]
        sizes = [kernels[0].shape[0]] + [kernel.shape[1] for kernel in kernels]
        if k > min(sizes):
            raise invalid("devices", f"groups of at most as many devices as the smallest "
                          f"partitioned layer has neurons ({min(sizes)}, stage {stage})",
                          devices_received)
        if isinstance(entry, str):
            result.append(partition_rows(kernels, k, method=entry))
            continue
        if len(entry) != len(by_stage[stage]):
            raise invalid("partition", f"{len(by_stage[stage])} Partitions for stage "
                          f"{stage} (one per run of consecutive SparseDense layers)",
                          entry)
        part = entry[by_stage[stage].index(run)]
        if part.sizes != sizes:
            raise invalid("partition", f"a Partition of layer sizes {sizes} for the "
                          f"SparseDense layers {[layers[i].name for i in run]}", part)
        result.append(part)
    return result


def build_runs(layers, stages, strategy):
    """The ``PartitionedLayers`` of every stage that has a group of devices
    (under Horovod: of this process's stage).

    Args:
      layers: the model's chain of layers (built).
      stages: the plan's layer indices per stage.
      strategy: the ``PipelineStrategy`` (its ``device_groups`` and
        ``partition``).
    """
    hvd = strategy._horovod
    found = find_runs(layers, stages, strategy.device_groups, strategy.devices_argument,
                      None if hvd is None else hvd.rank())
    parts = run_partitions(found, layers, strategy.partition, strategy.devices_argument,
                           strategy.device_groups)
    return [PartitionedLayers([layers[i] for i in run], strategy.device_groups[stage],
                              part, stage, run)
            for (stage, run), part in zip(found, parts)]


def pattern_fingerprint(layer):
    """A fingerprint of a SparseDense layer's pattern (its positions), 8 bytes."""
    positions = tf.stack([layer.pattern_rows, layer.pattern_cols])
    return tf.fingerprint(tf.reshape(positions, [1, -1]))[0]


def _scatter_columns(pieces, columns, width):
    """Sums the columns of ``pieces`` into ``width`` columns at ``columns``."""
    joined = tf.concat(pieces, axis=1) if len(pieces) > 1 else pieces[0]
    index = tf.constant(np.concatenate(columns).astype(np.int32))
    return tf.transpose(tf.math.unsorted_segment_sum(tf.transpose(joined), index, width))


class PartitionedLayers:
    """Consecutive SparseDense layers of one stage, row-partitioned over devices.

    Stands in the executor's stage for the layers it replaces: ``record``
    runs the forward of one micro-batch, ``trainable_variables`` are the
    shards' variables, ``load``/``store`` copy the layers' variables to and
    from them. Each device computes its ``LayerShard`` of every layer
    (``tfsparse.partition.shards``); the last layer's activation, when it is
    not element-wise, is applied to the assembled output on the first device.

    Args:
      layers: the SparseDense layers (built), in order; only the last may
        have a non-element-wise activation.
      devices: the group's device names; the first one holds the input and
        output of the run and runs the stage's other layers.
      partition: a ``Partition`` of the layers into ``len(devices)`` parts.
      stage: the stage index; ``indices``: the layers' indices in the chain.
    """

    def __init__(self, layers, devices, partition, stage, indices):
        self.layers, self.devices = list(layers), list(devices)
        self.partition, self.stage, self.indices = partition, stage, tuple(indices)
        for layer in self.layers[:-1]:
            if ends_run(layer):
                raise invalid("layers", "a non-element-wise activation only in the last "
                              "layer of a partitioned run", layer.name)
        k, owners = len(self.devices), partition.owners
        self.shards = [[layer_shard(layer, owners[l], owners[l + 1], p, k) for p in range(k)]
                       for l, layer in enumerate(self.layers)]
        self.plans = [[shard.plan for shard in shards] for shards in self.shards]
        for l, plans in enumerate(self.plans):
            for p, plan in enumerate(plans):
                if plan.owned_outputs.size == 0 or plan.kernel.nnz == 0:
                    raise invalid("partition", "every device of a group to own neurons "
                                  f"with weights in every layer (device {self.devices[p]} "
                                  f"has none in {self.layers[l].name})", partition)
        self._output_order = np.argsort(np.concatenate(
            [plan.owned_outputs for plan in self.plans[-1]]))
        self.values, self.biases, self._device_of = [], [], {}
        with tf.init_scope():
            for layer, shards in zip(self.layers, self.shards):
                values, biases = [], []
                for p, (device, shard) in enumerate(zip(self.devices, shards)):
                    value, bias = shard_weights(layer, shard)
                    with tf.device(device):
                        values.append(tf.Variable(value, name=f"{layer.name}_values_part{p}"))
                        biases.append(None if bias is None else tf.Variable(
                            bias, name=f"{layer.name}_bias_part{p}"))
                    for variable in (values[-1], biases[-1]):
                        if variable is not None:
                            self._device_of[variable.ref()] = device
                self.values.append(values)
                self.biases.append(biases)
            # The pattern the shards were cut from: a later one (loaded or
            # set into the layer) would be read at the old positions.
            self._fingerprints = [pattern_fingerprint(layer) for layer in self.layers]
        self.trainable_variables = [
            v for values, biases in zip(self.values, self.biases)
            for pair in zip(values, biases) for v in pair if v is not None]

    @property
    def name(self):
        return "+".join(layer.name for layer in self.layers)

    def variable_device(self, variable):
        """The device of a shard variable (None for any other variable)."""
        return self._device_of.get(variable.ref())

    def words_per_sample(self):
        """Words the run moves between devices per sample, forward.

        Returns:
          ``(entry, exchanges, exit)``: the input entries the other devices
          receive from the first one for the first layer; per later layer
          the entries exchanged between devices (``partition.send[l].sum()``);
          the output entries the first device receives. The backward pass
          moves as many the other way.
        """
        entry = sum(plan.local_inputs.size for plan in self.plans[0][1:])
        exchanges = [sum(self.plans[l][q].send[p].size for p in range(len(self.devices))
                         for q in range(len(self.devices)) if q != p)
                     for l in range(1, len(self.layers))]
        exit_words = sum(plan.owned_outputs.size for plan in self.plans[-1][1:])
        return entry, exchanges, exit_words

    # ------------------------------------------------------------- weights
    def _device_weights(self):
        """Per layer, per device: the device's ``(values, bias)`` read from the
        layer's variables (on their device)."""
        result = []
        for layer, shards, kept in zip(self.layers, self.shards, self._fingerprints):
            with tf.device(layer.values.device):
                same = tf.debugging.assert_equal(
                    pattern_fingerprint(layer), kept, message=(
                        f"The pattern of {layer.name} changed after PipelineStrategy "
                        f"partitioned it over {', '.join(self.devices)} (set_weights or "
                        "load_weights of another pattern): its shards hold the old one. "
                        "Load weights before the pipeline first runs the model (after "
                        "attach, before fit, evaluate or predict), or attach the model "
                        "to the strategy again (its stages' optimizers then start "
                        "afresh)."))
                with tf.control_dependencies([same]):  # the reads wait for the check
                    result.append([shard_weights(layer, shard) for shard in shards])
        return result

    def load(self):
        """Copies the layers' variables into the shards; returns the op."""
        ops = []
        for weights, values, biases in zip(self._device_weights(), self.values, self.biases):
            for p, device in enumerate(self.devices):
                with tf.device(device):
                    ops.append(values[p].assign(weights[p][0]))
                    if biases[p] is not None:
                        ops.append(biases[p].assign(weights[p][1]))
        return tf.group(*ops)

    def store(self):
        """Copies the shards back into the layers' variables; returns the op."""
        ops = []
        for l, layer in enumerate(self.layers):
            plans = self.plans[l]
            values, biases = [], []
            for p, device in enumerate(self.devices):
                with tf.device(device):
                    values.append(self.values[l][p].read_value())
                    if self.biases[l][p] is not None:
                        biases.append(self.biases[l][p].read_value())
            with tf.device(layer.values.device):
                ops.append(layer.values.assign(assemble(
                    values, [plan.positions for plan in plans], layer.nnz)))
                if biases:
                    ops.append(layer.bias.assign(assemble(
                        biases, [plan.owned_outputs for plan in plans], layer.units)))
        return tf.group(*ops)

    # ------------------------------------------------------------- forward
    def record(self, inputs):
        """The run's forward on one micro-batch; returns a ``PartitionedRecord``."""
        assembled, steps = self._forward(inputs, self._compute)
        last = self.layers[-1]
        if not ends_run(last):
            return PartitionedRecord(self, inputs, assembled, steps)
        with tf.name_scope("partitioned_output"), tf.device(self.devices[0]):
            with tf.GradientTape() as tape:
                tape.watch(assembled)
                outputs = finish_outputs(assembled, last.activation)
        return PartitionedRecord(self, inputs, outputs, steps, finish=(tape, assembled))

    def inference_weights(self):
        """The layers' current weights cut by device, for ``infer``.

        Returns:
          Per layer, per device: ``(values, bias)`` tensors (``bias`` None
          without one) of the device's neurons, gathered from the Keras
          layer's variables (not the shards, which only hold the weights
          during a training window) and placed on the device: about ``nnz``
          words moved per layer, once per call.
        """
        result = []
        for weights in self._device_weights():
            per_device = []
            for device, (values, bias) in zip(self.devices, weights):
                with tf.device(device):
                    per_device.append((tf.identity(values),
                                       None if bias is None else tf.identity(bias)))
            result.append(per_device)
        return result

    def infer(self, inputs, weights):
        """The run's outputs on ``inputs`` for ``evaluate`` and ``predict``.

        The training forward's placement and exchange (each device computes
        its own neurons from the entries they reference), with ``weights``
        from ``inference_weights`` and no tape.
        """
        def compute(l, p, local):
            values, bias = weights[l][p]
            return (self._apply(l, p, local, values, bias),)

        assembled, _ = self._forward(inputs, compute)
        with tf.name_scope("partitioned_output"), tf.device(self.devices[0]):
            return finish_outputs(assembled, self.layers[-1].activation)

    def _forward(self, inputs, compute):
        """Runs ``compute(l, p, local input)`` (a tuple ending with the
        outputs) per layer and device, moving the entries each needs.

        Returns:
          The run's outputs before a non-element-wise last activation, on
          the first device, and per layer, per device, what ``compute``
          returned.
        """
        primary, k = self.devices[0], len(self.devices)
        dtype = self.layers[0].compute_dtype
        x = tf.convert_to_tensor(inputs)
        x = x if x.dtype == dtype else tf.cast(x, dtype)
        steps, owned = [], None
        for l, layer in enumerate(self.layers):
            plans, step = self.plans[l], []
            with tf.name_scope(f"partitioned_{layer.name}"):
                for p, device in enumerate(self.devices):
                    if l == 0:
                        with tf.device(primary):
                            piece = tf.gather(x, plans[p].local_inputs, axis=1)
                        pieces = [piece]
                    else:
                        pieces = [owned[p]]
                        for q in range(k):
                            send = self.plans[l][q].send[p]
                            if q != p and send.size:
                                with tf.device(self.devices[q]):
                                    pieces.append(tf.gather(owned[q], send, axis=1))
                    with tf.device(device):
                        local = (tf.concat(pieces, axis=1) if len(pieces) > 1
                                 else tf.identity(pieces[0]))
                        step.append(compute(l, p, local))
            owned = [found[-1] for found in step]
            steps.append(step)
        with tf.name_scope("partitioned_output"), tf.device(primary):
            outputs = tf.gather(tf.concat(owned, axis=1), self._output_order, axis=1)
        return outputs, steps

    def _compute(self, l, p, local):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(local)
            outputs = self._apply(l, p, local, self.values[l][p], self.biases[l][p])
        return tape, local, outputs

    def _apply(self, l, p, local, values, bias):
        """Device ``p``'s neurons of layer ``l`` on its local input."""
        return shard_outputs(self.shards[l][p], local, values, bias,
                             self.layers[l].activation)


class PartitionedRecord:
    """One micro-batch through a ``PartitionedLayers``, for the executor.

    ``upstream`` (the gradient at the run's output, on the first device) is
    set by the executor before ``input_gradient`` or ``weight_gradient``.
    ``finish``: for a last activation applied to the assembled output, the
    tape that recorded it and the output before it.
    """

    penalty = None
    split = False

    def __init__(self, layer, inputs, outputs, steps, finish=None):
        self.layer, self.inputs, self.outputs = layer, inputs, outputs
        self.upstream = None
        self._steps = steps  # per layer, per device: (tape, local input, outputs)
        self._finish = finish
        self._upstreams = None

    def _output_gradients(self):
        """Per layer, per device: the gradient at the device's own outputs."""
        if self._upstreams is not None:
            return self._upstreams
        run, k = self.layer, len(self.layer.devices)
        last = len(run.layers) - 1
        upstreams = [None] * (last + 1)
        with tf.name_scope("partitioned_output_backward"):
            with tf.device(run.devices[0]):
                upstream = self.upstream
                if self._finish is not None:
                    tape, assembled = self._finish
                    upstream = tape.gradient(self.outputs, assembled,
                                             output_gradients=upstream)
                parts = [tf.gather(upstream, plan.owned_outputs, axis=1)
                         for plan in run.plans[last]]
            upstreams[last] = []
            for device, part in zip(run.devices, parts):
                with tf.device(device):
                    upstreams[last].append(tf.identity(part))
        for l in range(last, 0, -1):
            with tf.name_scope(f"partitioned_{run.layers[l].name}_backward"):
                received = [self._local_gradient(l, p, upstreams[l][p]) for p in range(k)]
                upstreams[l - 1] = []
                for q, device in enumerate(run.devices):
                    owned = run.plans[l][q].owned_inputs.size
                    pieces, columns = [], [np.arange(owned)]
                    for p in range(k):
                        send = run.plans[l][q].send[p]
                        if p != q and send.size:
                            pieces.append(received[p][q])
                            columns.append(send)
                    with tf.device(device):
                        own = received[q][q]
                        upstreams[l - 1].append(
                            _scatter_columns([own] + pieces, columns, owned) if pieces
                            else own)
        self._upstreams = upstreams
        return upstreams

    def _local_gradient(self, l, p, upstream):
        """Device ``p``'s input gradient of layer ``l``, cut by the device each
        part came from: ``{q: gradient}`` (``q == p``: its own inputs)."""
        run = self.layer
        tape, local, outputs = self._steps[l][p]
        plan = run.plans[l][p]
        with tf.device(run.devices[p]):
            gradient = tape.gradient(outputs, local, output_gradients=upstream)
            sizes = [plan.owned_inputs.size] + [r.size for q, r in enumerate(plan.received)
                                                if q != p and r.size]
            parts = tf.split(gradient, sizes, axis=1) if len(sizes) > 1 else [gradient]
        senders = [p] + [q for q, r in enumerate(plan.received) if q != p and r.size]
        return dict(zip(senders, parts))

    def input_gradient(self):
        """The gradient at the run's input, on the first device."""
        run = self.layer
        upstreams = self._output_gradients()
        with tf.name_scope(f"partitioned_{run.layers[0].name}_backward"):
            parts = []
            for p, device in enumerate(run.devices):
                tape, local, outputs = self._steps[0][p]
                with tf.device(device):
                    parts.append(tape.gradient(outputs, local, output_gradients=upstreams[0][p]))
            with tf.device(run.devices[0]):
                return _scatter_columns(parts, [plan.local_inputs for plan in run.plans[0]],
                                        int(self.inputs.shape[-1]))

    def weight_gradient(self):
        """Gradients of the shards, in ``trainable_variables`` order, each on its device."""
        run = self.layer
        upstreams = self._output_gradients()
        grads = []
        for l, layer in enumerate(run.layers):
            with tf.name_scope(f"partitioned_{layer.name}_weights"):
                for p, device in enumerate(run.devices):
                    tape, _, outputs = self._steps[l][p]
                    variables = [v for v in (run.values[l][p], run.biases[l][p])
                                 if v is not None]
                    with tf.device(device):
                        found = tape.gradient(outputs, variables,
                                              output_gradients=upstreams[l][p])
                        grads += [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                                  for g, v in zip(found, variables)]
        return grads
