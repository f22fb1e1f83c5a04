"""The forward pass of ``evaluate`` and ``predict``, pipelined over the stages.

One code path for both kinds of stages: with stages on local devices every
stage runs in this process and TensorFlow moves the activations between the
devices; under ``horovodrun`` (``HorovodTransport``) process ``r`` runs only
stage ``r``, receives each micro-batch's activation from process ``r - 1``
and sends its output to process ``r + 1`` (one ``hvd.broadcast`` from the
sender, matched by name, as in training). Only the last stage holds the
model's outputs: it computes the loss and metrics (or the predictions), and
``share_metrics`` / ``share_outputs`` bring them to every process. The loss
adds every stage's regularization losses, computed by the stage that ran
its layers and summed in the last stage's process (``share_penalties``).

A batch is cut into ``num_microbatches`` micro-batches when that divides it;
any other batch (Keras feeds a smaller last one) into ``min(M, rows)``
micro-batches whose sizes differ by at most one row, so every row is computed
exactly once and the pipeline still overlaps the stages.

A stage on a group of devices runs its partitioned SparseDense layers
(``runs``, see ``tfsparse.distribute._partitioned``) as in training: each
device computes its own neurons, with weights gathered from the Keras
layers' variables once per batch.
"""

import tensorflow as tf

from tfsparse.distribute._executor import LocalTransport
from tfsparse.distribute._executor import _replace_runs
from tfsparse.distribute._executor import microbatch_sizes
from tfsparse.distribute._partitioned import PartitionedLayers

INFER_ACTIVATION = "infer_activation"
INFER_OUTPUT = "infer_output"


def pipelined_forward(x, layers, groups, devices, transport, num_microbatches,
                      pending, first_microbatch=0, penalties=None, runs=()):
    """The chain's output on ``x``, micro-batches pipelined over the stages.

    Args:
      x: the batch of inputs (a tensor).
      layers: the model's chain of layers.
      groups: per stage, the indices of its layers (contiguous, in order).
      devices: per stage, its device (a group's first device).
      transport: ``LocalInference`` or ``HorovodTransport``: which stages this
        process runs, and how activations travel between them.
      num_microbatches: the strategy's micro-batches per batch.
      pending: a list that collects the tensors this process sends (they must
        run although nothing here reads them).
      first_microbatch: the index of this batch's first micro-batch in the
        window (names the messages, which must be unique in a graph).
      penalties: None, or a list that collects, per micro-batch and stage
        run here, the layers' losses (regularizers, ``add_loss``) on it
        times its share of the batch's rows: their sum is the batch's
        penalty as the model would compute it on the whole batch (an
        activity regularizer divides by the rows of its call).
      runs: the ``PartitionedLayers`` of the stages on groups of devices:
        each replaces its layers in its stage (under Horovod only
        this process's stage has them).

    Returns:
      The outputs of the last stage (the batch's rows, in order) in the
      process that runs the last stage; ``None`` in the others.
    """
    last = len(groups) - 1
    rows = x.shape[0]
    sizes = microbatch_sizes(int(rows) if rows is not None else tf.shape(x)[0],
                             num_microbatches)
    parts = tf.split(x, sizes, num=len(sizes) if isinstance(sizes, list) else num_microbatches)
    outbox, outputs = {}, []
    items = [_replace_runs([layers[i] for i in group], group, runs) for group in groups]
    # Gathered once per batch, each on its device, before any micro-batch.
    weights = {id(run): run.inference_weights() for run in runs
               if transport.runs(run.stage)}
    for offset, part in enumerate(parts):
        microbatch = first_microbatch + offset
        hidden = part
        for stage, (device, group) in enumerate(zip(devices, groups)):
            if not transport.runs(stage):
                continue
            with tf.device(device):
                if stage > 0:
                    key = (INFER_ACTIVATION, stage - 1, microbatch, ())
                    done = sum(len(g) for g in groups[:stage])
                    hidden = transport.receive(
                        key, outbox, stage - 1,
                        lambda done=done, part=part: activation_spec(
                            layers, done, part.shape[0], part),
                        pending)
                for item in items[stage]:
                    if isinstance(item, PartitionedLayers):
                        hidden = item.infer(hidden, weights[id(item)])
                    else:
                        hidden = item(hidden, training=False)
                if penalties is not None:
                    # A partitioned layer has no regularizer and is not called.
                    _collect_penalty(penalties, [item for item in items[stage] if not
                                                 isinstance(item, PartitionedLayers)],
                                     part, x)
                if stage < last:
                    key = (INFER_ACTIVATION, stage, microbatch, ())
                    outbox[key] = hidden
                    sent = transport.send(key, outbox, stage)
                    if sent is not None:
                        pending.append(sent)
        if transport.runs(last):
            outputs.append(hidden)
    if not outputs:
        return None
    with tf.device(devices[last]):
        return tf.concat(outputs, axis=0)


def _collect_penalty(penalties, layers, part, x):
    """Appends the losses ``layers`` added on ``part``, weighted by its rows."""
    losses = [tf.cast(loss, tf.float32) for layer in layers for loss in layer.losses]
    if not losses:
        return
    share = tf.cast(tf.shape(part)[0], tf.float32) / tf.cast(tf.shape(x)[0], tf.float32)
    # An empty micro-batch (batch size known only at run time) has a NaN
    # activity penalty (0 / 0 rows) and no share.
    penalties.append(tf.math.multiply_no_nan(tf.add_n(losses), share))


def activation_spec(layers, done, rows, inputs):
    """The ``tf.TensorSpec`` of the chain's activation after ``done`` layers.

    Args:
      layers: the model's chain of layers (built).
      done: how many of them have run (``len(layers)``: the model's output).
      rows: the activation's rows.
      inputs: a tensor of the network's inputs (for ``done == 0``).
    """
    if done == 0:
        return tf.TensorSpec([rows] + list(inputs.shape[1:]), inputs.dtype)
    layer = layers[done - 1]
    features = [int(d) for d in tuple(layer.output_shape)[1:]]
    return tf.TensorSpec([rows] + features, layer.compute_dtype)


class LocalInference(LocalTransport):
    """Every stage in this process: the last stage's results are already here."""

    def share_metrics(self, model, stage, pending):
        return model.get_metrics_result()

    def share_outputs(self, outputs, spec, stage, pending):
        return outputs, None  # nothing was sent, nothing to keep alive
