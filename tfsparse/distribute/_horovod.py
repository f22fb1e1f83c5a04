"""Stages in separate processes: sends and receives over Horovod collectives.

Under ``horovodrun`` process ``r`` runs stage ``r``: it builds the same
window graph as one process would, but only the ops of its own stage's
actions. A send and its receive are one ``hvd.broadcast`` from the sending
rank: the receiver passes zeros of the message's shape (both sides know it
from the plan) and gets the sender's tensor. Horovod matches the two by name,
and its ops are asynchronous kernels, so a receive waiting for its send
blocks no other op: the stage's order comes from the control dependencies,
as in one process.

Every process holds the whole model; a stage's weights change only in its
own process. After an update of a layer whose rows the previous stage
borrows, the owner broadcasts that layer's weights to the borrower (at the
same point of the trace order, so the borrower reads the weights it would
read in one process). At the end of a window every stage broadcasts its
weights to all processes and the last stage its metrics, so every process
ends with the same model and logs.
"""

import tensorflow as tf



class HorovodTransport:
    """Sends and receives between stage processes over ``hvd.broadcast``."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank = hvd.rank()
        # A receiver's placeholder must not be a constant: Grappler folds a
        # broadcast of constants, after which the collective never matches
        # (seen with Horovod 0.28.1 / TF 2.21). A variable's value is opaque.
        self._zeros = {dtype: tf.Variable(tf.zeros([], dtype), trainable=False)
                       for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64)}

    def _placeholder(self, shape, dtype):
        return tf.fill(shape, self._zeros[tf.as_dtype(dtype)].read_value())

    def prepare(self, model, batches):
        """Builds the loss and metric containers in every process (eagerly).

        Only the last stage computes them, but every process broadcasts their
        results, so every process needs the same metrics.
        """
        if model.compiled_loss.built:
            return
        x, y, _ = batches[0]
        y_pred = tf.zeros([x.shape[0]] + list(model.output_shape[1:]), model.output.dtype)
        model.compiled_loss.build(y_pred)
        model.compiled_metrics.build(y_pred, y)

    def runs(self, stage):
        return stage == self.rank

    @staticmethod
    def _name(key):
        kind, stage, microbatch, microbatches = key
        group = "_".join(str(m) for m in microbatches)
        return f"pipeline_{kind}_{stage}_{microbatch}_{group}"

    def send(self, key, outbox, rank):
        tensors = tf.nest.flatten(outbox.pop(key))
        name = self._name(key)
        sent = [self.hvd.broadcast(t, root_rank=rank, name=f"{name}_{i}")
                for i, t in enumerate(tensors)]
        return sent or None

    def receive(self, key, outbox, rank, spec, pending):
        structure = spec()
        name = self._name(key)
        flat = [self.hvd.broadcast(self._placeholder(s.shape, s.dtype), root_rank=rank,
                                   name=f"{name}_{i}")
                for i, s in enumerate(tf.nest.flatten(structure))]
        pending.extend(flat)  # a part the receiver does not use must still run
        return tf.nest.pack_sequence_as(structure, flat)

    def refresh_borrowed(self, executor, action, state):
        owner, borrower = action.stage, action.stage - 1
        if borrower < 0 or self.rank not in (owner, borrower):
            return
        if not executor.lent_rows(borrower, state.rows(action)):
            return
        variables = executor.stage_layers[owner][0].trainable_variables
        name = self._name(("refresh", owner, -1, action.microbatches))
        with tf.device(executor.devices[self.rank]), tf.control_dependencies(
                state.last[self.rank]):
            values = [self.hvd.broadcast(v.read_value() if self.rank == owner
                                         else self._placeholder(v.shape, v.dtype),
                                         root_rank=owner, name=f"{name}_{i}")
                      for i, v in enumerate(variables)]
            if self.rank == owner:
                state.pending.extend(values)
            else:
                state.last[self.rank] = [tf.group(*[v.assign(value) for v, value
                                                   in zip(variables, values)])]

    def finish(self, executor, pending):
        """Broadcasts weights and metrics; the logs carry a ``SINK`` entry.

        Horovod's ops are stateless to TensorFlow, so Grappler turns one whose
        output nothing reads into a no-op, and its partner process waits
        forever. Every broadcast whose output is not otherwise used (the
        sending side) is therefore summed into ``SINK``, an output of the
        window function that the strategy drops from the logs.
        """
        assigns, unread = [], list(tf.nest.flatten(pending))
        for stage, layers in enumerate(executor.stage_layers):
            variables = [v for layer in layers for v in layer.weights
                         if v.dtype.is_floating]
            for i, variable in enumerate(variables):
                value = self.hvd.broadcast(variable.read_value(), root_rank=stage,
                                           name=f"pipeline_weights_{stage}_{i}")
                if stage != self.rank:
                    assigns.append(variable.assign(value))
                else:
                    unread.append(value)
        # The metrics' state, so that Keras (which reads the metrics after
        # the train function) logs the same values in every process.
        last = len(executor.stage_layers) - 1
        metric_variables = [v for m in executor.model.metrics for v in m.variables]
        for i, variable in enumerate(metric_variables):
            value = self.hvd.broadcast(variable.read_value(), root_rank=last,
                                       name=f"pipeline_metric_{i}")
            if self.rank != last:
                assigns.append(variable.assign(value))
            else:
                unread.append(value)
        with tf.control_dependencies(assigns):
            logs = {m.name: tf.identity(m.result()) for m in executor.model.metrics}
        logs[SINK] = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in unread]
                              + [tf.zeros([])])
        return logs


SINK = "_pipeline_sink"
