"""PipelineStrategy: layer pipelining for Keras ``fit``, ``evaluate``, ``predict``.

TensorFlow has no pipeline strategy, and ``tf.distribute.Strategy``'s
contract is data-parallel (``run`` a replica function, ``reduce`` across
replicas), which a pipeline of different stages does not fit. So, as
Graphcore's IPU Keras did, ``PipelineStrategy`` takes over the step instead:
``strategy.attach(model)``, after ``model.compile``, gives that model a train
function that runs the schedule's action lists
(``tfsparse.distribute.schedule``) over its stages' devices, and test and
predict functions that pipeline the forward pass. Everything else
(callbacks, metrics, ``model.save``) is plain Keras; compiling the model
again makes it a plain Keras model.
"""

import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._validation import check_choice
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value as invalid
from tfsparse.distribute._binding import Binding
from tfsparse.distribute._binding import check_attachable
from tfsparse.distribute._partitioned import DEFAULT_METHOD
from tfsparse.distribute._partitioned import check_partition_argument
from tfsparse.distribute.schedules import SCHEDULES
from tfsparse.distribute.simulator import simulate as _simulate
from tfsparse.distribute.stages import check_costs


class PipelineStrategy:
    """Trains a chain of Keras layers as a pipeline of stages over devices.

    Stages are contiguous groups of layers, one per device, balanced by a
    cost model (``nnz x rows`` for ``SparseDense``, multiply-adds for
    ``Dense``) or by measured ``costs``, or given as ``stages``. Every
    mini-batch (Keras batch) is split into ``num_microbatches`` micro-batches
    and the schedule decides the order of forwards, backwards and updates on
    every stage. With ``steps_per_execution=k`` in ``compile`` one graph runs
    ``k`` mini-batches: the asynchronous schedules overlap them, and the
    pipeline drains at the end of each such window.

    The update of every stage uses the mean gradient of its micro-batches
    (each weighted by its rows when they differ in size), by a per-stage
    copy of the model's optimizer (so each stage's optimizer
    counts its own updates); ``model.optimizer.iterations`` counts the
    mini-batches. ``"gpipe"`` (and ``"1f1b"``) therefore equal training
    without a pipeline with the gradient accumulated over the micro-batches.
    Settings a stage's copy cannot honour are refused by ``attach``:
    ``global_clipnorm`` (the model's gradient norm), ``use_ema`` (Keras
    finalizes the model's own optimizer) and the new ``Nadam`` (its update
    depends on how many variables one optimizer steps; the legacy one works).

    A stage may run on a group of devices: ``devices=[["/gpu:0", "/gpu:1"],
    "/gpu:2"]`` gives stage 0 two. Its consecutive SparseDense layers are
    then row-partitioned over the group with
    ``tfsparse.partition.partition_rows`` (the "partitioned weights"):
    each device computes only the output neurons it owns, forward and
    backward, from the input entries they reference, received from the
    devices that own them (per later layer exactly the partition's volume);
    weight gradients and updates stay on each neuron's device. A
    SparseDense layer with a non-element-wise activation (softmax, a custom
    function) ends its run: the activation is applied to the run's output,
    assembled on the group's first device. The stage's other layers (and
    SparseDense layers with regularizers or constraints, which are not
    partitioned: see ``tfsparse.partition.shards``) run on the group's
    first device. Gradients are exact: ``"gpipe"`` with a partitioned stage
    equals it without. The layers keep their Keras variables (``save``,
    checkpoints, ``evaluate`` and ``predict`` see one ordinary model);
    each device trains copies of its neurons' weights, gathered from them
    at the start of every ``steps_per_execution`` window and written back
    at its end (see ``tfsparse.distribute._partitioned`` for the cost). The
    cost model counts a partitioned layer at ``1 / len(group)`` of its
    work; a partitioned layer is never split by rows with the previous
    stage (``"layerpipe"``). ``evaluate`` and ``predict`` run the same
    partitioned forward, with the layers' current weights.

    Args:
      devices: one entry per stage: a device name (e.g. ``["/cpu:0",
        "/cpu:1"]``), or a non-empty list of device names (a group) for a
        stage whose SparseDense layers are partitioned over them; a group
        on a stage without such layers raises ``ValueError``. Default every
        logical GPU, or every logical CPU when there is none.
        ``"horovod"``: one stage per process under ``horovodrun`` (after
        ``hvd.init()``), activations and gradients over Horovod collectives
        (see ``tfsparse.distribute._horovod``). ``evaluate`` and ``predict``
        are pipelined too: process ``r`` runs stage ``r``'s layers on every
        micro-batch, the last stage computes the loss, metrics or outputs,
        and every process returns them (every process must be fed the
        same data, as in ``fit``).
      num_microbatches: micro-batches per mini-batch. A batch it does not
        divide (such as Keras's smaller last one) is cut into
        ``min(num_microbatches, rows)`` micro-batches that differ by at most
        one row, in ``fit`` as in ``evaluate`` and ``predict``; in ``fit``
        each micro-batch's gradient is then weighted by its rows, so the
        update is still the mean gradient over the batch's rows, and the
        batch runs as a window of its own.
      schedule: ``"gpipe"``, ``"1f1b"``, ``"pipedream"``, ``"layerpipe"`` or
        ``"async"`` (see ``tfsparse.distribute.schedules``).
      stages: optional explicit assignment: one list per device of layer
        indices (of the model's chain, ``InputLayer`` excluded) or layers.
      costs: optional per-layer ``(forward, backward_input,
        backward_weight)`` (e.g. from ``tfsparse.distribute.profile``) to
        balance the stages with, instead of the cost model. Under Horovod
        every process uses rank 0's (every process must pass some).
      min_update_interval, max_in_flight: for ``"async"``.
      partition: how stages on a group of devices partition their
        SparseDense layers: a ``partition_rows`` method (``"hypergraph"``,
        ``"graph"``, ``"block"``, ``"random"``); a ``tfsparse.partition.
        Partition`` (when one stage has a group); or one entry per stage
        (None, a method, a ``Partition``, or a list of ``Partition``, one
        per run of consecutive SparseDense layers of the stage). The
        partitions in use: ``model.pipeline.partitions()``.
      local_devices: with ``devices="horovod"`` only: this process's
        devices for its stage (default its GPU by local rank, or its CPU).
        Several make every process's stage a group: its SparseDense layers
        are partitioned over them as above, the activations between the
        processes travel over Horovod, those inside a group through
        TensorFlow. A stage with no layer to partition runs on the first.
        ``model.pipeline.partitions()`` then holds this process's stage.

    Attributes:
      devices: the device of every stage (a group's first device).
      device_groups: every stage's devices, a tuple of tuples.

    Example:
      >>> import numpy as np
      >>> from tfsparse._keras import keras
      >>> strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2,
      ...                             schedule="gpipe")
      >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
      >>> model.compile("sgd", "mse")
      >>> model = strategy.attach(model)
      >>> history = model.fit(np.ones((8, 4)), np.zeros((8, 2)), batch_size=4,
      ...                     verbose=0)

      A stage on two devices (logical CPUs made with
      ``tf.config.set_logical_device_configuration``):

      >>> import tfsparse
      >>> strategy = PipelineStrategy(devices=[["/cpu:0", "/cpu:1"], "/cpu:0"],
      ...                             num_microbatches=2, schedule="gpipe",
      ...                             stages=[[0, 1], [2]])  # doctest: +SKIP
      >>> model = keras.Sequential([
      ...     keras.Input((32,)),
      ...     tfsparse.SparseDense(64, density=0.1, activation="relu"),
      ...     tfsparse.SparseDense(64, density=0.1, activation="relu"),
      ...     keras.layers.Dense(10)])
      >>> model.compile("sgd", "mse")
      >>> model = strategy.attach(model)  # doctest: +SKIP
    """

    def __init__(self, devices=None, num_microbatches=8, schedule="layerpipe",
                 stages=None, *, costs=None, min_update_interval=None,
                 max_in_flight=None, partition=DEFAULT_METHOD, local_devices=None):
        self.num_microbatches = check_positive_int("num_microbatches", num_microbatches)
        self.schedule = check_choice("schedule", schedule, SCHEDULES)
        self._horovod = None
        if isinstance(devices, str) and devices == "horovod":
            self._horovod, devices = _horovod_devices(local_devices)
        elif local_devices is not None:
            raise invalid("local_devices", 'None unless devices="horovod"', local_devices)
        self.devices_argument = devices
        self.device_groups = _check_devices(devices)
        self.devices = [group[0] for group in self.device_groups]
        self.partition = check_partition_argument(partition, self.device_groups)
        self.options = {}
        for name, value in (("min_update_interval", min_update_interval),
                            ("max_in_flight", max_in_flight)):
            if value is not None:
                if schedule != "async":
                    raise invalid(name, 'None unless schedule="async"', value)
                self.options[name] = check_positive_int(name, value)
        if stages is not None and (not isinstance(stages, (list, tuple))
                                   or len(stages) != len(self.devices)):
            raise invalid("stages", f"one list of layers per device "
                          f"({len(self.devices)})", stages)
        self.stages = stages
        self.costs = None if costs is None else check_costs(costs)
        if self._horovod is not None and self.costs is not None:
            # Every process must plan the same stages: measured costs differ
            # from process to process, so all use rank 0's.
            self.costs = self._horovod.broadcast_object(
                self.costs, root_rank=0, name="pipeline_costs")

    @property
    def num_stages(self):
        return len(self.devices)

    def attach(self, model):
        """Makes ``model``'s ``fit``, ``evaluate`` and ``predict`` run this pipeline.

        Call it after ``model.compile``. It sets, on this model only, the
        train, test and predict functions Keras keeps between two
        ``compile`` calls, and ``model.pipeline`` (the plan, the stages'
        optimizers, ``partitions()``). No class is changed: other models,
        in this thread or another, are untouched. Compiling the model again
        detaches it: it then trains as a plain Keras model (attach it again
        to pipeline it), and its checkpoints no longer hold the stages'
        optimizer copies. With a tf_keras optimizer the state carries over
        as over Keras's ``compile``: attached again, the stages step on from
        theirs; compiled with the same optimizer, it takes theirs; attached
        after plain Keras training, or to another strategy, the new stages
        take over the optimizer's or the last stages'.

        Args:
          model: a compiled tf_keras model whose layers form a chain
            (Sequential, or functional with each layer consuming the
            previous one's output, the last one's the only output), fed one
            tensor each of inputs, targets and sample weights. A loss a
            layer's call adds must be a mean over its rows (as an activity
            regularizer's): a sum would count ``num_microbatches`` times too
            little, undetected. A model that overrides ``train_step``,
            ``test_step``, ``predict_step``, ``compute_loss``,
            ``compute_metrics`` or a ``make_*_function`` method is refused:
            the pipeline runs steps of its own, which would bypass them.

        Returns:
          ``model``.

        Raises:
          ValueError: for a model that is not compiled, overrides a step,
            uses loss scaling (``"mixed_float16"``), an optimizer with
            ``global_clipnorm`` or ``use_ema`` or the new ``Nadam`` (the
            stages' optimizer copies would train differently), adds a loss to the
            model itself, whose optimizer's steps the stages cannot take over
            (a legacy optimizer's, or those of stages on groups of devices),
            or (when built) is not a chain of at least as many
            layers as there are stages or has a trainable BatchNormalization
            with ``num_microbatches > 1``.
        """
        check_attachable(model)
        if isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer):
            # Loss scaling would need one dynamic scale agreed on by every
            # stage (and process); the stages' own optimizer copies cannot.
            raise invalid("optimizer", 'an optimizer without loss scaling: PipelineStrategy '
                          'does not scale losses; use the "mixed_bfloat16" policy (which '
                          'needs no loss scaling) or float32', model.optimizer)
        _check_stage_optimizer(model.optimizer)
        Binding(self, model).attach()
        return model

    def simulate(self, model, batch_size, steps=1, costs=None, **kwargs):
        """The simulator's prediction of this strategy training ``model``.

        Args:
          model: a model attached to this strategy.
          batch_size: the mini-batch size; one that ``num_microbatches``
            does not divide is cut as ``fit`` cuts it (its larger
            micro-batches' costs are simulated).
          steps: mini-batches (the graph's window, ``steps_per_execution``).
          costs: per-layer costs for one micro-batch (default: the strategy's
            ``costs`` or the cost model).
          **kwargs: passed to ``tfsparse.distribute.simulate``.

        Returns:
          A ``SimulationResult`` of the exact plan the pipeline executes.
        """
        binding = getattr(model, "pipeline", None)
        if not isinstance(binding, Binding) or binding.strategy is not self \
                or not binding.attached:
            raise invalid("model", "a model attached to this strategy "
                          "(strategy.attach(model) after model.compile)",
                          getattr(model, "name", model))
        sizes = binding.microbatch_sizes(check_positive_int("batch_size", batch_size))
        plan = binding.plan(sizes[0])
        if costs is None:
            costs = binding.costs(sizes[0])
        return _simulate(self.schedule, costs, self.num_stages, len(sizes),
                         steps, stages=plan, **self.options, **kwargs)


def _check_stage_optimizer(optimizer):
    """Raises ``ValueError`` for optimizer settings the stages' copies cannot honour.

    Every stage updates its variables with its own copy of the optimizer, so
    a setting that needs all the model's gradients or variables at once
    would silently differ from training without a pipeline.
    """
    if getattr(optimizer, "global_clipnorm", None) is not None:
        raise invalid("optimizer", "an optimizer without global_clipnorm: each stage's copy "
                      "would clip by its own gradients' norm, not the model's (clipnorm, "
                      "per variable, and clipvalue train as without a pipeline)",
                      f"{type(optimizer).__name__}(global_clipnorm="
                      f"{optimizer.global_clipnorm})")
    if getattr(optimizer, "use_ema", False):
        raise invalid("optimizer", "an optimizer without use_ema: the stages' copies keep "
                      "the moving averages, and Keras's end of fit finalizes the model's "
                      "own optimizer, which never stepped", f"{type(optimizer).__name__}"
                      "(use_ema=True)")
    if type(optimizer) is keras.optimizers.Nadam:
        raise invalid("optimizer", "an optimizer other than the new Nadam: its update "
                      "depends on how many variables one optimizer steps, so the stages' "
                      "copies train differently (keras.optimizers.legacy.Nadam trains as "
                      "without a pipeline)", "Nadam")


def _horovod_devices(local_devices):
    """One stage per Horovod process: on ``local_devices`` (a group when there
    are several), else on the local GPU (by local rank) or the CPU."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        raise invalid("devices", '"horovod" only with Horovod installed',
                      "horovod") from None
    if not hvd.is_initialized():
        raise invalid("devices", '"horovod" after hvd.init() (one stage per process)',
                      "horovod")
    if local_devices is not None:
        # Checked as stages of one device each: one group, no nested lists.
        entries = _check_devices(local_devices, "local_devices")
        if any(len(entry) != 1 for entry in entries):
            raise invalid("local_devices", "a non-empty list of this process's device "
                          "names", local_devices)
        return hvd, [[entry[0] for entry in entries]] * hvd.size()
    gpus = tf.config.list_logical_devices("GPU")
    local = gpus[hvd.local_rank() % len(gpus)].name if gpus else (
        tf.config.list_logical_devices("CPU")[0].name)
    return hvd, [local] * hvd.size()


def _check_devices(devices, argument="devices"):
    """Every stage's devices (a tuple of tuples), or raises ``ValueError``."""
    available = tf.config.list_logical_devices()
    if devices is None:
        gpus = [d.name for d in available if d.device_type == "GPU"]
        names = gpus or [d.name for d in available if d.device_type == "CPU"]
        return tuple((name,) for name in names)
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)) or not devices:
        raise invalid(argument, "a non-empty list of device names", devices)
    groups = tuple((entry,) if isinstance(entry, str) else
                   tuple(entry) if isinstance(entry, (list, tuple)) else None
                   for entry in devices)
    if any(not group or not all(isinstance(d, str) for d in group) for group in groups):
        raise invalid(argument, "a list with, per stage, a device name or a non-empty "
                      "list of device names", devices)
    specs = [tf.DeviceSpec.from_string(d.name) for d in available]
    for device in (d for group in groups for d in group):
        try:
            wanted = tf.DeviceSpec.from_string(device)
        except (TypeError, ValueError):
            raise invalid(argument, "a list of device names", devices) from None
        found = any(
            spec.device_type == (wanted.device_type or "").upper()
            and spec.device_index == (wanted.device_index or 0)
            and all(getattr(wanted, field) in (None, getattr(spec, field))
                    for field in ("job", "replica", "task"))
            for spec in specs)
        if not found:
            names = ", ".join(d.name for d in available)
            raise invalid(argument, f"existing devices (this process has: {names})",
                          devices)
    return groups
