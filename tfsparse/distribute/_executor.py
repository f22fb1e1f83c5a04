"""Executes a schedule's action lists as one TensorFlow graph.

Every action becomes the ops it stands for, placed on its stage's device and
chained to the stage's previous action by control dependencies, so each
device runs its list in order while TensorFlow's executor runs the devices
in parallel and moves tensors between them (the sends and receives).
Actions are traced in the simulator's time order (every send before its
receive), which is also the order TensorFlow's automatic control
dependencies give to reads and writes of one variable.

Each layer of each micro-batch is recorded on its own persistent
``GradientTape``: ``backward_input`` asks it for the gradient with respect to
the layer's input, ``backward_weight`` for the gradient with respect to its
weights, reusing the upstream gradient ``backward_input`` received. The
forward's variable reads are what the tape differentiates, so a backward
always uses the weights its forward used (PipeDream's weight stashing).
"""

import dataclasses

import tensorflow as tf

from tfsparse.distribute import schedules as S
from tfsparse.distribute._partitioned import PartitionedLayers
from tfsparse.distribute._partitioned import PartitionedRecord
from tfsparse.distribute.simulator import replay


@dataclasses.dataclass
class _Record:
    """One layer applied to (some rows of) one micro-batch."""

    layer: object
    tape: object
    inputs: object
    outputs: object
    penalty: object  # the layer's losses on this call (or None)
    upstream: object = None  # gradient at the outputs, set by backward_input
    split: bool = False  # the previous stage computed this layer's other rows


class PipelineExecutor:
    """Builds the ops of a pipelined training window for a chain of layers.

    Args:
      model: the compiled Keras model (for its loss and metrics).
      layers: the model's chain of layers.
      plan: a ``StagePlan`` with the borrowed fractions to use.
      devices: one device name per stage.
      optimizers: one Keras optimizer per stage.
      name: the schedule name; ``options``: its extra arguments.
      num_microbatches: micro-batches per mini-batch.
      stage_costs: per stage cost triples (only order the graph's tracing).
      transport: how sends and receives travel: ``LocalTransport`` (one
        process, TensorFlow moves tensors between devices) or
        ``tfsparse.distribute._horovod.HorovodTransport`` (one stage per
        process).
      runs: ``PartitionedLayers`` that replace their layers in their stage
        (a stage on a group of devices, see
        ``tfsparse.distribute._partitioned``).
      device_optimizers: ``{(stage, device): optimizer}`` for the shards on
        the other devices of a group (``optimizers[stage]`` updates those
        on the stage's device).
    """

    def __init__(self, model, layers, plan, devices, optimizers, name,
                 num_microbatches, options, stage_costs, transport=None,
                 runs=(), device_optimizers=None):
        self.model = model
        self.plan = plan
        self.devices = list(devices)
        self.optimizers = optimizers
        self.name = name
        self.num_microbatches = num_microbatches
        self.options = dict(options)
        self.stage_costs = stage_costs
        self.runs = list(runs)
        self.keras_layers = [[layers[i] for i in group] for group in plan.stages]
        self.stage_layers = [_replace_runs(group_layers, group, self.runs)
                             for group_layers, group in zip(self.keras_layers, plan.stages)]
        self.stage_variables = [[v for layer in group for v in layer.trainable_variables]
                                for group in self.stage_layers]
        self.update_groups = [self._update_groups(s, device_optimizers or {})
                              for s in range(len(self.devices))]
        self.transport = transport or LocalTransport()

    def _update_groups(self, stage, device_optimizers):
        """``(device, optimizer, variable positions)`` per device of ``stage``."""
        groups = {}
        for i, variable in enumerate(self.stage_variables[stage]):
            device = None
            for run in self.runs:
                device = device or run.variable_device(variable)
            if device is None or device == self.devices[stage]:
                key, optimizer = self.devices[stage], self.optimizers[stage]
            else:
                key, optimizer = device, device_optimizers[(stage, device)]
            groups.setdefault(key, (key, optimizer, []))[2].append(i)
        return list(groups.values())

    def optimizer_variables(self):
        """Every optimizer with the variables it updates (to build it)."""
        return [(optimizer, [self.stage_variables[s][i] for i in positions])
                for s, groups in enumerate(self.update_groups)
                for _, optimizer, positions in groups]

    # ---------------------------------------------------------------- window
    def train_window(self, batches):
        """Traces the schedule over ``batches`` (one (x, y, weight) per step).

        Returns:
          The metrics' results after the window, a dict of scalar tensors.
        """
        num_stages = len(self.devices)
        sched = S.schedule(self.name, num_stages, self.num_microbatches,
                           steps=len(batches), **self.options)
        order = replay(sched, self.stage_costs).order
        state = _WindowState(num_stages, self._split(batches))
        for run in self.runs:  # the shards start from the layers' variables
            state.last[run.stage].append(run.load())
        for action in order:
            self._run(action, state)
        stored = []
        for run in self.runs:
            with tf.control_dependencies(state.last[run.stage]):
                stored.append(run.store())
        with tf.control_dependencies([op for ops in state.last for op in ops] + stored):
            return self.transport.finish(self, state.pending)

    def _split(self, batches):
        micro = []
        for x, y, weight in batches:
            sizes = microbatch_sizes(batch_rows(x), self.num_microbatches)
            if len(sizes) != self.num_microbatches:
                raise ValueError(f"a batch of {sum(sizes)} rows cannot be cut into "
                                 f"{self.num_microbatches} micro-batches")
            parts = [tf.split(t, sizes) if t is not None else
                     [None] * len(sizes) for t in (x, y, weight)]
            micro += list(zip(*parts))
        return micro

    def lent_rows(self, stage, rows):
        """Rows of each micro-batch that ``stage`` computes of the next stage's first layer."""
        return lent_rows(self.plan, stage, rows)

    def _run(self, action, state):
        if not self.transport.runs(action.stage):
            if action.kind == S.UPDATE:
                self.transport.refresh_borrowed(self, action, state)
            return
        handler = {
            S.FORWARD: self._forward,
            S.BACKWARD_INPUT: self._backward_input,
            S.BACKWARD_WEIGHT: self._backward_weight,
            S.UPDATE: self._update,
            S.SEND_ACTIVATION: self._send,
            S.SEND_GRADIENT: self._send,
            S.SEND_WEIGHT_GRADIENT: self._send_weight_gradient,
            S.RECEIVE_ACTIVATION: self._receive,
            S.RECEIVE_GRADIENT: self._receive,
            S.RECEIVE_WEIGHT_GRADIENT: self._receive,
        }[action.kind]
        stage = action.stage
        with tf.device(self.devices[stage]), tf.control_dependencies(state.last[stage]):
            produced = handler(action, state)
        if produced is not None:
            state.last[stage] = [tf.group(*tf.nest.flatten(produced))]
        if action.kind == S.UPDATE:
            self.transport.refresh_borrowed(self, action, state)

    # ----------------------------------------------------------- transfers
    def _send(self, action, state):
        key = (action.kind, action.stage, action.microbatch, action.microbatches)
        sent = self.transport.send(key, state.outbox, self._sender_rank(action.stage))
        if sent is not None:
            state.pending.append(sent)
        return None

    def _receive(self, action, state):
        send_kind, offset = S.RECEIVES[action.kind]
        sender = action.stage + offset
        key = (send_kind, sender, action.microbatch, action.microbatches)
        rows = state.rows(action)
        state.inbox[(action.kind, action.stage, action.microbatch, action.microbatches)] = (
            self.transport.receive(key, state.outbox, self._sender_rank(sender),
                                   lambda: self.message_spec(send_kind, sender, rows),
                                   state.pending))
        return None

    def _sender_rank(self, stage):
        return stage

    def _send_weight_gradient(self, action, state):
        weights = state.row_weights(action.microbatches)
        parts = [[_weighted(g, w) for g in state.lent_grads.pop((action.stage, m), None) or []]
                 for m, w in zip(action.microbatches, weights)]
        parts = [p for p in parts if p]
        partial = [tf.add_n(list(column)) for column in zip(*parts)] if parts else []
        state.outbox[(action.kind, action.stage, -1, action.microbatches)] = partial
        return self._send(action, state)

    def message_spec(self, kind, sender, rows):
        """Shapes and dtypes of what ``sender`` sends, as ``tf.TensorSpec``s."""
        lent = self.lent_rows(sender, rows)
        if kind == S.SEND_WEIGHT_GRADIENT:
            if not lent:
                return []
            return [tf.TensorSpec(v.shape, v.dtype)
                    for v in self.stage_layers[sender + 1][0].trainable_variables]
        # Shapes from the Keras layers (a stage may start with partitioned ones).
        if kind == S.SEND_ACTIVATION:
            nxt = self.keras_layers[sender + 1][0]
            inputs, outputs = _feature_shape(nxt.input_shape), _feature_shape(nxt.output_shape)
        else:  # the gradient of what the receiver sent
            first = self.keras_layers[sender][0]
            inputs, outputs = _feature_shape(first.input_shape), _feature_shape(first.output_shape)
            lent = self.lent_rows(sender - 1, rows)
        dtype = self.model.layers[-1].compute_dtype
        if not lent:
            return tf.TensorSpec([rows] + inputs, dtype)
        return (tf.TensorSpec([rows - lent] + inputs, dtype),
                tf.TensorSpec([lent] + outputs, dtype))

    # ------------------------------------------------------------- compute
    def _forward(self, action, state):
        stage, m = action.stage, action.microbatch
        last = stage == len(self.devices) - 1
        x, y, weight = state.micro[m]
        records = []
        layers = self.stage_layers[stage]
        if stage == 0:
            hidden = x
        else:
            received = state.inbox.pop((S.RECEIVE_ACTIVATION, stage, m, ()))
            if isinstance(received, tuple):  # (own rows' input, lent rows' output)
                own_rows, lent_output = received
                record = _apply(layers[0], own_rows)
                record.split = True
                records.append(record)
                hidden = tf.concat([record.outputs, lent_output], axis=0)
                layers = layers[1:]
            else:
                hidden = received
        for layer in layers:
            record = _apply(layer, hidden)
            records.append(record)
            hidden = record.outputs
        state.records[(stage, m)] = records
        penalties = [r.penalty for r in records if r.penalty is not None]
        # The last stage's loss adds every stage's penalties on this micro-batch.
        penalties = self.transport.share_penalties(
            f"pipeline_penalty_{m}", penalties, last, state.pending)
        state.penalties.setdefault(m, []).extend(penalties)
        if last:
            with tf.GradientTape() as tape:
                tape.watch(hidden)
                loss = self.model.compiled_loss(
                    y, hidden, weight, regularization_losses=state.penalties.pop(m))
            self.model.compiled_metrics.update_state(y, hidden, weight)
            state.loss_gradient[m] = tape.gradient(loss, hidden)
            return [hidden, loss]
        rows = hidden.shape[0]
        lent = self.lent_rows(stage, rows)
        if lent:
            keep = rows - lent
            record = _apply(self.stage_layers[stage + 1][0], hidden[keep:])
            state.lent_records[(stage, m)] = record
            outgoing = (hidden[:keep], record.outputs)
        else:
            outgoing = hidden
        state.outbox[(S.SEND_ACTIVATION, stage, m, ())] = outgoing
        return outgoing

    def _backward_input(self, action, state):
        stage, m = action.stage, action.microbatch
        if stage == len(self.devices) - 1:
            upstream = state.loss_gradient.pop(m)
        else:
            upstream = state.inbox.pop((S.RECEIVE_GRADIENT, stage, m, ()))
            lent = state.lent_records.get((stage, m))
            if lent is not None:  # (own rows' input gradient, lent rows' output gradient)
                own_rows, lent_upstream = upstream
                lent.upstream = lent_upstream
                upstream = tf.concat([own_rows, _input_gradient(lent)], axis=0)
        records = state.records[(stage, m)]
        gradient = upstream
        for index in range(len(records) - 1, -1, -1):
            record = records[index]
            if record.split:  # send (own rows' input gradient, lent rows' output gradient)
                own = record.outputs.shape[0]
                record.upstream = gradient[:own]
                lent_part = gradient[own:]
                gradient = (_input_gradient(record), lent_part)
                break
            record.upstream = gradient
            if index == 0 and stage == 0:
                gradient = None  # the network input needs no gradient
                break
            gradient = _input_gradient(record)
        if stage > 0:
            state.outbox[(S.SEND_GRADIENT, stage, m, ())] = gradient
        return [r.upstream for r in records] + (
            [] if gradient is None else tf.nest.flatten(gradient))

    def _backward_weight(self, action, state):
        stage, m = action.stage, action.microbatch
        grads = []
        for record in state.records.pop((stage, m)):
            grads += _weight_gradient(record)
        state.grads.setdefault(stage, {})[m] = grads
        lent = state.lent_records.pop((stage, m), None)
        produced = list(grads)
        if lent is not None:
            partial = _weight_gradient(lent)
            state.lent_grads[(stage, m)] = partial
            produced += partial
        return produced if produced else [tf.constant(0.0)]

    def _update(self, action, state):
        stage = action.stage
        variables = self.stage_variables[stage]
        if not variables:
            for m in action.microbatches:
                state.grads.get(stage, {}).pop(m, None)
            return None
        weights = state.row_weights(action.microbatches)
        mine = [state.grads[stage].pop(m) for m in action.microbatches]
        received = state.inbox.pop(
            (S.RECEIVE_WEIGHT_GRADIENT, stage, -1, action.microbatches), None) or []
        columns = list(zip(*mine))
        scale = 1.0 / len(action.microbatches)
        updates = []
        for device, optimizer, positions in self.update_groups[stage]:
            # Each device sums and applies the gradients of its own variables.
            with tf.device(device):
                grads = []
                for i in positions:
                    total = tf.add_n([_weighted(g, w) for g, w in zip(columns[i], weights)])
                    if i < len(received):  # the previous stage's partial gradient
                        total = total + received[i]
                    grads.append(total * tf.cast(scale, total.dtype))
                updates.append(optimizer.apply_gradients(
                    zip(grads, [variables[i] for i in positions])))
        return updates


class _WindowState:
    def __init__(self, num_stages, micro):
        self.micro = micro
        self.last = [[] for _ in range(num_stages)]
        self.pending = []  # tensors that must be computed although nothing reads them
        self.outbox, self.inbox = {}, {}
        self.records, self.lent_records = {}, {}
        self.grads, self.lent_grads = {}, {}
        self.loss_gradient, self.penalties = {}, {}

    def rows(self, action):
        """Rows of the micro-batch(es) an action is about."""
        index = action.microbatch if action.microbatch >= 0 else action.microbatches[0]
        return self._rows(index)

    def _rows(self, microbatch):
        return batch_rows(self.micro[microbatch][0])

    def row_weights(self, microbatches):
        """Per micro-batch, its rows over their mean over ``microbatches``.

        An update averages the gradients of its micro-batches; weighted so,
        the average is the mean over their rows when the micro-batches
        differ in size (a batch that ``num_microbatches`` does not divide).
        ``None`` for each when they are all the same size (no weighting).
        """
        rows = [self._rows(m) for m in microbatches]
        if len(set(rows)) == 1:
            return [None] * len(rows)
        return [r * len(rows) / sum(rows) for r in rows]


class LocalTransport:
    """One process: a receive reads the sent tensor on the receiving device."""

    def prepare(self, model, batches):
        return None

    def runs(self, stage):
        return True

    def send(self, key, outbox, rank):
        return None  # the receive reads outbox[key]

    def receive(self, key, outbox, rank, spec, pending):
        return tf.nest.map_structure(tf.identity, outbox.pop(key))

    def refresh_borrowed(self, executor, action, state):
        return None

    def share_penalties(self, name, penalties, receiver, pending):
        """The penalties for the loss: here every stage's are in this process."""
        return penalties

    def finish(self, executor, pending):
        return {m.name: tf.identity(m.result()) for m in executor.model.metrics}


def _feature_shape(shape):
    return [int(d) for d in tuple(shape)[1:]]


def batch_rows(x):
    """The static number of rows of a (micro-)batch's inputs ``x``."""
    return int(tf.nest.flatten(x)[0].shape[0])


def microbatch_sizes(rows, num_microbatches):
    """Rows of each micro-batch of a batch of ``rows`` rows.

    Args:
      rows: a Python int (the static batch size), or a scalar integer tensor
        when the batch size is only known at run time.
      num_microbatches: the strategy's micro-batches per batch.

    Returns:
      For an int: a list of ``min(num_microbatches, rows)`` ints that differ
      by at most one, larger first, summing to ``rows``. For a tensor: a
      tensor of ``num_microbatches`` such sizes (some 0 when ``rows`` is
      smaller).

    Example:
      >>> microbatch_sizes(12, 4), microbatch_sizes(6, 4), microbatch_sizes(2, 4)
      ([3, 3, 3, 3], [2, 2, 1, 1], [1, 1])
    """
    if isinstance(rows, int):
        parts = min(num_microbatches, rows)
        return [rows // parts + (i < rows % parts) for i in range(parts)]
    return rows // num_microbatches + tf.cast(
        tf.range(num_microbatches) < rows % num_microbatches, rows.dtype)


def lent_rows(plan, stage, rows):
    """Rows of a micro-batch of ``rows`` that ``stage`` computes of the next
    stage's first layer: the plan's fraction, rounded, the owner keeping one."""
    if stage + 1 >= plan.num_stages or rows < 2:
        return 0
    return min(int(round(plan.borrowed[stage] * rows)), rows - 1)


def _weighted(gradient, weight):
    """``gradient`` times ``weight`` (``None``: the gradient as it is)."""
    return gradient if weight is None else gradient * tf.cast(weight, gradient.dtype)


def _replace_runs(layers, indices, runs):
    """``layers`` (at chain ``indices``) with each run's layers replaced by the run."""
    items, position = [], 0
    while position < len(layers):
        run = next((r for r in runs if r.indices[0] == indices[position]), None)
        items.append(layers[position] if run is None else run)
        position += 1 if run is None else len(run.indices)
    return items


def _apply(layer, inputs):
    if isinstance(layer, PartitionedLayers):
        return layer.record(inputs)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(inputs)
        outputs = layer(inputs, training=True)
        penalty = tf.add_n(layer.losses) if layer.losses else None
    return _Record(layer, tape, inputs, outputs, penalty)


def _input_gradient(record):
    if isinstance(record, PartitionedRecord):
        return record.input_gradient()
    targets, upstream = [record.outputs], [record.upstream]
    if record.penalty is not None:
        targets.append(record.penalty)
        upstream.append(tf.ones_like(record.penalty))
    return record.tape.gradient(targets, record.inputs, output_gradients=upstream)


def _weight_gradient(record):
    if isinstance(record, PartitionedRecord):
        return record.weight_gradient()
    variables = record.layer.trainable_variables
    if not variables:
        return []
    targets, upstream = [record.outputs], [record.upstream]
    if record.penalty is not None:
        targets.append(record.penalty)
        upstream.append(tf.ones_like(record.penalty))
    grads = record.tape.gradient(targets, variables, output_gradients=upstream)
    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, variables)]
