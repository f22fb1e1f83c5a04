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
read in one process). Every stage's regularization losses on a micro-batch
reach the last stage's loss through one ``hvd.allreduce`` per micro-batch
(``share_penalties``). At the end of a window every stage broadcasts its
weights to all processes and the last stage its metrics, so every process
ends with the same model and logs.

``evaluate`` and ``predict`` use the same sends and receives for the forward
pass (``tfsparse.distribute._inference``): process ``r`` runs stage ``r`` on
every micro-batch, and the last stage broadcasts its metrics' state
(``share_metrics``) or its predictions (``share_outputs``) to every process.
Every process must therefore be fed the same batches, as in ``fit``.
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

    def share_penalties(self, name, penalties, receiver, pending):
        """Every stage's penalties, for the process that computes the loss.

        A stage's regularization losses (weight and activity regularizers,
        ``add_loss``) on a micro-batch (or, in ``evaluate``, a batch) are
        computed in the stage's own process, where its gradients need them;
        the loss reported by the last stage adds them all, as in one
        process. Every process calls this once per ``name``: one
        ``hvd.allreduce`` sums the other processes' penalties (each a
        float32 scalar, zero where a stage has none) and the receiver
        contributes zero, so the sum arrives unchanged.

        Args:
          name: the collective's name, unique in the graph.
          penalties: this process's scalar penalties (a list, maybe empty).
          receiver: whether this process computes the loss.
          pending: collects the sending side's result (see ``finish``).

        Returns:
          For the receiver, ``[others] + penalties``; else ``[]``.
        """
        zero = self._placeholder([], tf.float32)  # not a constant, see __init__
        own = (tf.add_n([tf.cast(p, tf.float32) for p in penalties])
               if penalties and not receiver else zero)
        total = self.hvd.allreduce(own, op=self.hvd.Sum, name=name)
        if not receiver:
            pending.append(total)
            return []
        return [total] + list(penalties)

    def finish(self, executor, pending):
        """Broadcasts weights and metrics; the logs carry a ``SINK`` entry.

        Horovod's ops are stateless to TensorFlow, so Grappler turns one whose
        output nothing reads into a no-op, and its partner process waits
        forever. Every broadcast whose output is not otherwise used (the
        sending side) is therefore summed into ``SINK``, an output of the
        window function that the strategy drops from the logs.
        """
        assigns, unread = [], list(tf.nest.flatten(pending))
        # The Keras layers' variables: a partitioned run has written its
        # shards back into them (``store``) before this runs.
        for stage, layers in enumerate(executor.keras_layers):
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
        assigns += self._broadcast_metrics(executor.model, last, unread, "pipeline_metric")
        with tf.control_dependencies(assigns):
            logs = {m.name: tf.identity(m.result()) for m in executor.model.metrics}
        logs[SINK] = _sink(unread)
        return logs

    # ------------------------------------------------- evaluate, predict
    def share_metrics(self, model, stage, pending):
        """The metrics of ``stage`` (which computed them) in every process.

        Returns:
          ``model.get_metrics_result()`` after every process's metric
          variables were set to ``stage``'s, plus a ``SINK`` entry (see
          ``finish``) that the caller drops.
        """
        unread = list(tf.nest.flatten(pending))
        assigns = self._broadcast_metrics(model, stage, unread, "pipeline_eval_metric")
        with tf.control_dependencies(assigns):
            logs = dict(model.get_metrics_result())
        logs[SINK] = _sink(unread)
        return logs

    def share_outputs(self, outputs, spec, stage, pending):
        """``stage``'s ``outputs`` (``None`` elsewhere) in every process.

        Args:
          outputs: the tensor on the process running ``stage``, else ``None``.
          spec: a callable returning its ``tf.TensorSpec`` (every process
            knows it).
          stage: the sending stage.
          pending: tensors sent earlier, summed into the ``SINK``.

        Returns:
          ``(outputs, sink)``: ``sink`` is a scalar that reads ``pending``
          (see ``finish``), for the caller to return and drop.
        """
        if self.rank == stage:
            value = outputs
        else:
            wanted = spec()
            value = self._placeholder(wanted.shape, wanted.dtype)
        shared = self.hvd.broadcast(value, root_rank=stage, name="pipeline_infer_output")
        return shared, _sink(pending)

    def _broadcast_metrics(self, model, root, unread, prefix):
        """Sets every process's metric variables to ``root``'s; returns the assigns."""
        assigns = []
        variables = [v for m in model.metrics for v in m.variables]
        for i, variable in enumerate(variables):
            value = self.hvd.broadcast(variable.read_value(), root_rank=root,
                                       name=f"{prefix}_{i}")
            if self.rank != root:
                assigns.append(variable.assign(value))
            else:
                unread.append(value)
        return assigns


def _sink(tensors):
    """One scalar that reads every tensor (keeps Grappler from pruning them)."""
    return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tf.nest.flatten(tensors)]
                    + [tf.zeros([])])


SINK = "_pipeline_sink"
