"""The pipeline of one compiled model: its plan, executor and step functions.

``PipelineStrategy.attach(model)`` makes a ``Binding`` (``model.pipeline``)
and sets the model's ``train_function``, ``test_function`` and
``predict_function``, the functions Keras caches between two ``compile``
calls, to the binding's. No method of the model or of its class is
overridden, except that the model's own ``compile`` attribute first detaches
the binding (so a recompiled model is a plain Keras model again).
"""

import dataclasses
import functools
import itertools
import weakref

import tensorflow as tf

from tfsparse._framework_internal import compiled_losses
from tfsparse._framework_internal import count_steps
from tfsparse._framework_internal import model_level_losses
from tfsparse._keras import keras
from tfsparse._model_chain import chain_layers
from tfsparse._validation import invalid_value as invalid
from tfsparse.distribute import costs as _costs
from tfsparse.distribute._executor import PipelineExecutor
from tfsparse.distribute._executor import batch_rows
from tfsparse.distribute._executor import lent_rows
from tfsparse.distribute._executor import microbatch_sizes
from tfsparse.distribute._horovod import SINK
from tfsparse.distribute._inference import LocalInference
from tfsparse.distribute._inference import activation_spec
from tfsparse.distribute._inference import pipelined_forward
from tfsparse.distribute._partitioned import build_runs
from tfsparse.distribute.stages import check_stages
from tfsparse.distribute.stages import plan_stages
from tfsparse.partition.shards import partitionable

# Loss reductions that average over the batch (Keras's default, "auto", does).
MEAN_REDUCTIONS = (keras.losses.Reduction.AUTO, keras.losses.Reduction.SUM_OVER_BATCH_SIZE)

# Layers that normalize by the statistics of the batch they are called on.
BATCH_STATISTICS_LAYERS = (keras.layers.BatchNormalization,
                           keras.layers.experimental.SyncBatchNormalization)

# What a new tf_keras optimizer's exclude_from_weight_decay sets (not part
# of its config, so not in a copy made from it).
EXCLUDED_FROM_WEIGHT_DECAY = ("_exclude_from_weight_decay",
                              "_exclude_from_weight_decay_names")

# The model methods that define its steps. The pipeline runs steps of its own
# (the loss by ``compiled_loss`` per micro-batch, ``compiled_metrics``), so a
# model that overrides one of them would have it bypassed: it is refused.
STEP_METHODS = ("train_step", "test_step", "predict_step", "compute_loss",
                "compute_metrics", "make_train_function", "make_test_function",
                "make_predict_function")


def check_attachable(model):
    """Raises ``ValueError`` unless ``model`` is a compiled Keras model whose
    steps are Keras's own (no override of ``STEP_METHODS``)."""
    if not isinstance(model, keras.Model):
        raise invalid("model", "a compiled tf_keras Model", type(model).__name__)
    overridden = [name for name in STEP_METHODS
                  if getattr(type(model), name) is not getattr(keras.Model, name)]
    if overridden:
        raise invalid("model", f"a model that does not override {', '.join(STEP_METHODS)} "
                      "(the pipeline runs its own steps, which would bypass them)",
                      f"{type(model).__name__} overriding {', '.join(overridden)}")
    if getattr(model, "compiled_loss", None) is None:
        raise invalid("model", "a compiled model (call model.compile, then "
                      "strategy.attach(model))", model.name)
    # The pipeline averages the micro-batches' losses and gradients, which
    # is the batch's for a mean over the batch only: a sum would come out
    # num_microbatches times too small.
    for loss in compiled_losses(model):
        reduction = getattr(loss, "reduction", MEAN_REDUCTIONS[0])
        if reduction not in MEAN_REDUCTIONS:
            raise invalid(
                "model", "a model compiled with losses that average over the batch "
                f"(reduction {' or '.join(map(repr, MEAN_REDUCTIONS))}: the pipeline "
                "averages its micro-batches)",
                f"{getattr(loss, 'name', type(loss).__name__)!r} with reduction {reduction!r}")


@dataclasses.dataclass
class StageOptimizers:
    """The stages' optimizer copies of a binding, and what they copied."""

    strategy: object
    optimizer: object  # the model's optimizer they are copies of
    optimizers: list
    device_optimizers: dict
    steps: int  # the model optimizer's step count when they last stepped


# Per model, the stage optimizers of its last detached binding: the next
# binding of the same strategy and optimizer (attach again, or compile with
# the same optimizer and attach) steps on from their state, as Keras keeps
# an optimizer's state across compile.
_DETACHED = weakref.WeakKeyDictionary()


def _stage_optimizers_of(model, previous):
    if isinstance(previous, Binding) and previous._optimizers is not None:
        return previous._stage_optimizers()
    return _DETACHED.get(model)


def _restoring_stage_optimizers(model):
    """Whether a checkpoint restored into ``model`` waits to fill stage optimizers."""
    return "pipeline_optimizers" in getattr(model, "_deferred_dependencies", {})


def _matched_state(copy, optimizer):
    """Pairs ``(copy's variable, optimizer's variable)`` for each state
    variable of ``copy`` (a stage's built copy) but its step count: matched
    by name (the optimizer's name scope, the slot's name, the variable's).
    A slot ``optimizer`` lacks, or has twice, is an error."""
    def key(owner, variable):  # built in apply_gradients, a slot's name has
        scope = f"{owner.name}/"  # the optimizer's name scope in front
        name = variable.name
        return name[len(scope):] if name.startswith(scope) else name

    by_name = {}
    for variable in optimizer.variables:
        by_name.setdefault(key(optimizer, variable), []).append(variable)
    pairs = []
    for variable in copy.variables:
        if variable is copy.iterations:
            continue
        found = by_name.get(key(copy, variable), [])
        if len(found) != 1 or found[0].shape != variable.shape:
            raise invalid(
                "model", "a model whose optimizer holds one state variable per name for "
                "the stages' optimizers (compile it with a new optimizer to start "
                "afresh)", received=f"{len(found)} variable(s) named "
                f"{variable.name!r} in model.optimizer")
        pairs.append((variable, found[0]))
    return pairs


def _take_over_state(copy, optimizer):
    """Gives ``copy`` (built) ``optimizer``'s step count and its slots of the
    same variables: a model trained by plain Keras, then pipelined, steps on
    as it would have."""
    copy.iterations.assign(optimizer.iterations)
    for mine, theirs in _matched_state(copy, optimizer):
        mine.assign(theirs)


def _hand_back_state(copies, optimizer, variables):
    """Gives ``optimizer`` (the model's, built on ``variables`` if it is not)
    the stages' slots, when a recompile with it detaches the pipeline: plain
    Keras then steps on from them (its step count the pipeline kept)."""
    if not getattr(optimizer, "_built", False):
        optimizer.build(variables)
    for copy in copies:
        for mine, theirs in _matched_state(copy, optimizer):
            theirs.assign(mine)


class Binding:
    """The pipeline of one compiled model: plan, executor, step functions."""

    def __init__(self, strategy, model):
        self.strategy = strategy
        self.model = model
        self._compile = None
        self._layers = None
        self._executors = {}
        self._windows = {}
        self._optimizers = None
        self._device_optimizers = {}  # (stage, device): for a group's other devices
        self._learning_rate = None  # the one the stages' optimizers were last given
        self._take_over_from = None  # an optimizer whose state new copies take over
        self._runs = {}  # stages: their PartitionedLayers
        self._inference_transport = None
        self._inference_windows = {}

    # ------------------------------------------------------------ attaching
    def attach(self):
        """Points the model's Keras functions at this pipeline (see the module)."""
        model = self.model
        previous = getattr(model, "pipeline", None)
        kept = _stage_optimizers_of(model, previous)
        optimizer = model.optimizer
        steps = int(keras.backend.get_value(optimizer.iterations))
        current = (kept is not None and kept.optimizer is optimizer and kept.steps == steps)
        new_style = isinstance(optimizer, keras.optimizers.Optimizer)
        if current and kept.strategy is self.strategy:
            self._optimizers = kept.optimizers
            self._device_optimizers = dict(kept.device_optimizers)
        elif current and steps and new_style and not kept.device_optimizers:
            # Another strategy: the optimizer takes the last stages' state,
            # which the new stages take over.
            _hand_back_state(kept.optimizers, optimizer, model.trainable_variables)
            self._take_over_from = optimizer
        elif steps and not _restoring_stage_optimizers(model):
            # The stages' new copies take over the optimizer's state when
            # they are built (_take_over_state): only a new tf_keras
            # optimizer that holds the model's state (stepped it, or was
            # handed the stages' by a compile) has it.
            if current or not (new_style and getattr(optimizer, "_built", False)):
                raise invalid(
                    "model", "a model whose optimizer has taken no steps, or holds the "
                    "state of its steps: a tf_keras optimizer (not a legacy one) of plain "
                    "Keras training or of a pipeline on one device per stage (each stage "
                    "steps a copy of the optimizer; a stage on a group of devices keeps "
                    "shards): compile the model with a new optimizer to start afresh; a "
                    "checkpoint written while attached restores the stages' state",
                    received=f"model.optimizer ({type(optimizer).__name__}) after "
                    f"{steps} step(s) outside this pipeline")
            self._take_over_from = optimizer
        if isinstance(previous, Binding):
            previous.detach()
        if model.built:
            self.layers()  # fail early: not a chain, too many stages
        compile_ = type(model).compile

        @functools.wraps(compile_)
        def compile_and_detach(*args, **kwargs):
            optimizer = model.optimizer
            self.detach()
            result = compile_(model, *args, **kwargs)
            if (model.optimizer is optimizer and self._optimizers is not None
                    and not self._device_optimizers
                    and isinstance(optimizer, keras.optimizers.Optimizer)):
                # Compiled again with the same optimizer, as Keras keeps its
                # state: the stages' is its state now.
                _hand_back_state(self._optimizers, optimizer, model.trainable_variables)
            return result

        model.train_function = self.train_function
        model.test_function = self.test_function
        model.predict_function = self.predict_function
        model.pipeline = self
        model.compile = self._compile = compile_and_detach

    def _stage_optimizers(self):
        return StageOptimizers(self.strategy, self.model.optimizer, self._optimizers,
                               self._device_optimizers,
                               int(keras.backend.get_value(self.model.optimizer.iterations)))

    @property
    def attached(self):
        """Whether the model still runs this pipeline (not compiled again since)."""
        return (getattr(self.model, "pipeline", None) is self
                and self.model.train_function == self.train_function)

    def detach(self):
        """Makes the model a plain Keras model again: Keras builds its own
        functions at the next fit, evaluate or predict; the model loses
        ``pipeline``, its ``compile`` attribute and the stages' optimizer
        copies (``pipeline_optimizers``, no longer in its checkpoints)."""
        model = self.model
        if self._optimizers is not None:
            _DETACHED[model] = self._stage_optimizers()
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(model, name, None) == getattr(self, name):
                setattr(model, name, None)
        if getattr(model, "pipeline", None) is self:
            del model.pipeline
            if "pipeline_optimizers" in vars(model):
                # Deleting an attribute leaves Keras's checkpoint dependency
                # on its value: pointed at an empty list, it saves nothing.
                model.pipeline_optimizers = []
                del model.pipeline_optimizers
        if self._compile is not None and vars(model).get("compile") is self._compile:
            del model.compile
        self._compile = None

    # ------------------------------------------------------------ planning
    def layers(self):
        if self._layers is None:
            model_losses = model_level_losses(self.model)
            if model_losses:
                # Each stage adds its own layers' losses; one added to the
                # model as a whole belongs to no stage and would be lost.
                raise invalid(
                    "model", "no loss added to the model itself (PipelineStrategy adds "
                    "the losses of the model's layers, their regularizers and add_loss "
                    "calls, to the training loss: add it from a layer's call() or as a "
                    "layer's regularizer instead)",
                    received=f"a model with {len(model_losses)} model.add_loss loss(es)")
            layers = chain_layers(self.model)
            self._check_batch_statistics(layers)
            stages = self.strategy.num_stages
            if stages > len(layers):
                raise invalid("devices", "at most one device per layer (the model "
                              f"has {len(layers)} layer{'s' * (len(layers) != 1)})",
                              self.strategy.devices)
            self._layers = layers
        return self._layers

    def _check_batch_statistics(self, layers):
        """Refuses training BatchNormalization layers when batches are cut into
        micro-batches: each micro-batch would be normalized by its own
        statistics, and the moving ones updated once per micro-batch."""
        if self.strategy.num_microbatches <= 1:
            return
        normalizing = [sub.name for layer in layers for sub in layer._flatten_layers()
                       if isinstance(sub, BATCH_STATISTICS_LAYERS) and sub.trainable]
        if normalizing:
            raise invalid(
                "model", "no trainable BatchNormalization layer when num_microbatches > 1 "
                "(each micro-batch would be normalized by its own statistics, not the "
                "batch's): freeze it (trainable=False: inference mode), use "
                "LayerNormalization or GroupNormalization, or num_microbatches=1",
                received=f"trainable BatchNormalization layer(s) {', '.join(normalizing)} "
                f"with num_microbatches={self.strategy.num_microbatches}")

    def microbatch_sizes(self, batch_size):
        """Rows of each micro-batch of a training batch of ``batch_size`` rows:
        ``min(num_microbatches, batch_size)`` sizes that differ by at most one."""
        return microbatch_sizes(batch_size, self.strategy.num_microbatches)

    def costs(self, rows):
        if self.strategy.costs is not None:
            if len(self.strategy.costs) != len(self.layers()):
                raise invalid("costs", f"one triple per layer ({len(self.layers())})",
                              self.strategy.costs)
            return self.strategy.costs
        return _costs.model_costs(self.model, rows)

    def _explicit_stages(self):
        stages = self.strategy.stages
        if stages is None:
            return None
        index = {id(layer): i for i, layer in enumerate(self.layers())}
        try:
            converted = [[index[id(item)] if isinstance(item, keras.layers.Layer)
                          else item for item in group] for group in stages]
        except KeyError:
            raise invalid("stages", "layers of the model (or their indices)",
                          stages) from None
        return check_stages(converted, len(self.layers()), self.strategy.num_stages)

    def plan(self, rows):
        """The executed plan: borrowed fractions rounded to whole rows."""
        layers = self.layers()
        groups = [len(group) for group in self.strategy.device_groups]
        grouped = max(groups) > 1
        plan = plan_stages(self.costs(rows), self.strategy.num_stages,
                           split=self.strategy.schedule == "layerpipe",
                           splittable=_costs.splittable_layers(layers),
                           stages=self._explicit_stages(),
                           group_sizes=groups if grouped else None,
                           partitioned=[partitionable(l) for l in layers] if grouped else None)
        rounded = tuple(lent_rows(plan, s, rows) / rows for s in range(plan.num_stages))
        return dataclasses.replace(plan, borrowed=rounded)

    def partitioned_runs(self, plan):
        """The ``PartitionedLayers`` of the plan's stages on groups of devices."""
        return self._stage_runs(plan.stages)

    def _stage_runs(self, stages):
        stages = tuple(tuple(group) for group in stages)
        if stages not in self._runs:
            # Eager even while evaluate or predict traces: the partition
            # reads the layers' patterns and the runs create their shards.
            with tf.init_scope():
                self._runs[stages] = build_runs(self.layers(), stages, self.strategy)
        return self._runs[stages]

    def _grouped(self):
        return max(len(group) for group in self.strategy.device_groups) > 1

    def partitions(self):
        """``{stage: [Partition, ...]}``: per stage on a group of devices, the
        partition of each run of consecutive SparseDense layers."""
        runs = {id(r): r for found in self._runs.values() for r in found}
        if not runs:
            runs = {id(r): r for r in self.partitioned_runs(self.plan(1))}
        result = {}
        for run in runs.values():
            result.setdefault(run.stage, []).append(run.partition)
        return result

    def executor(self, batch_rows):
        """The executor of training batches of ``batch_rows`` rows.

        Its plan is that of the batch's largest micro-batch.
        """
        if batch_rows not in self._executors:
            sizes = self.microbatch_sizes(batch_rows)
            rows = sizes[0]
            plan = self.plan(rows)
            runs = self.partitioned_runs(plan)
            optimizer = self.model.optimizer

            def copy():
                made = type(optimizer).from_config(optimizer.get_config())
                # Not in the config: the variables AdamW (any new optimizer)
                # leaves undecayed (exclude_from_weight_decay).
                for name in EXCLUDED_FROM_WEIGHT_DECAY:
                    if hasattr(optimizer, name):
                        setattr(made, name, list(getattr(optimizer, name)))
                return made

            if self._optimizers is None:
                self._optimizers = [copy() for _ in range(self.strategy.num_stages)]
            for run in runs:
                for device in run.devices[1:]:
                    if (run.stage, device) not in self._device_optimizers:
                        self._device_optimizers[(run.stage, device)] = copy()
            # Tracked by the model, so that its checkpoints (BackupAndRestore,
            # save_weights) carry every stage's optimizer state; one restored
            # earlier fills them when they are attached or built.
            self.model.pipeline_optimizers = list(self._optimizers) + [
                self._device_optimizers[key] for key in sorted(self._device_optimizers)]
            executor = PipelineExecutor(
                self.model, self.layers(), plan, self.strategy.devices,
                self._optimizers, self.strategy.schedule, len(sizes),
                self.strategy.options, plan.stage_costs(self.costs(rows)),
                transport=self._transport(), runs=runs,
                device_optimizers=self._device_optimizers)
            if isinstance(optimizer, keras.optimizers.Optimizer):
                # Built before tracing, so the window is traced once.
                for stage_optimizer, variables in executor.optimizer_variables():
                    stage_optimizer.build(variables)
                    if self._take_over_from is not None:
                        _take_over_state(stage_optimizer, self._take_over_from)
                self._take_over_from = None  # once: the copies step on from here
            self._executors[batch_rows] = executor
        return self._executors[batch_rows]

    def _transport(self):
        if self.strategy._horovod is None:
            return None
        from tfsparse.distribute._horovod import HorovodTransport

        return HorovodTransport(self.strategy._horovod)

    @property
    def stage_optimizers(self):
        return self._optimizers

    # ------------------------------------------------------------ training
    def train_function(self, iterator):
        batches = self._next_window(iterator)
        self._follow_learning_rate()
        # A window's batches of one size run as one schedule; a batch of
        # another size (Keras's smaller last one) as a window of its own,
        # cut into micro-batches that differ by at most one row.
        for rows, group in itertools.groupby(batches, key=lambda batch: batch_rows(batch[0])):
            group = list(group)
            executor = self.executor(rows)
            executor.transport.prepare(self.model, group)
            if self.model.run_eagerly:
                logs = executor.train_window(group)
                continue
            if rows not in self._windows:
                # No autograph: the window is straight-line code (the schedule
                # is unrolled in Python), and converting every call it makes
                # multiplies the tracing time.
                self._windows[rows] = tf.function(executor.train_window, autograph=False)
            logs = self._windows[rows](group)
        self.model.optimizer.iterations.assign_add(len(batches))
        count_steps(self.model, "train", len(batches))
        logs = dict(logs)
        logs.pop(SINK, None)  # see tfsparse.distribute._horovod
        return logs

    def _follow_learning_rate(self):
        """Gives every stage's optimizer the model optimizer's learning rate.

        Callbacks (LearningRateScheduler, ReduceLROnPlateau) and users set
        ``model.optimizer.learning_rate``; the stages step copies of that
        optimizer. A schedule is a function of the step, which each copy
        counts as the model's optimizer does: nothing to follow.
        """
        rate = self.model.optimizer.learning_rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate):
            return
        value = float(keras.backend.get_value(rate))
        if value == self._learning_rate:
            return
        for optimizer in itertools.chain(self._optimizers or (),
                                         self._device_optimizers.values()):
            optimizer.learning_rate = value
        self._learning_rate = value

    def _next_window(self, iterator):
        """The next ``steps_per_execution`` batches as (x, y, weight) tuples."""
        spe = self.model.steps_per_execution
        window = 1 if spe is None else int(spe.numpy())
        batches = []
        for _ in range(window):
            try:
                data = next(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                if not batches:
                    raise
                break
            x, y, weight = keras.utils.unpack_x_y_sample_weight(data)
            for name, value in (("x", x), ("y", y), ("sample_weight", weight)):
                if tf.nest.is_nested(value):
                    raise invalid(name, "a single tensor per batch (the pipeline cuts the "
                                  "model's one input, target and weights into "
                                  "micro-batches)",
                                  received=f"{name} of type {type(value).__name__}")
            if not self.model.built:
                self.model.build(x.shape)
            batches.append((x, y, weight))
        return batches

    # --------------------------------------------------- evaluate, predict
    def forward_stages(self):
        """Per stage, the layers it runs in ``evaluate`` and ``predict``.

        The explicit ``stages``, else whole layers balanced by the cost model
        (the forward pass borrows no rows). With a stage on a group of
        devices, training's stages, so that inference runs the partitions
        training uses.
        """
        if self._grouped():
            return self.plan(1).stages
        return self._explicit_stages() or plan_stages(
            _costs.model_costs(self.model, 1), self.strategy.num_stages).stages

    def _inference(self):
        if self._inference_transport is None:
            self._inference_transport = self._transport() or LocalInference()
        return self._inference_transport

    def forward(self, x, pending=None, first_microbatch=0, penalties=None):
        """The model's output on ``x``, micro-batches pipelined over the stages.

        ``None`` in a process that does not run the last stage (Horovod).
        ``penalties``: see ``pipelined_forward``. A stage on a group of
        devices runs its partitioned layers partitioned, as in training.
        """
        stages = self.forward_stages()
        runs = self._stage_runs(stages) if self._grouped() else ()
        return pipelined_forward(x, self.layers(), stages,
                                 self.strategy.devices, self._inference(),
                                 self.strategy.num_microbatches,
                                 [] if pending is None else pending, first_microbatch,
                                 penalties, runs)

    def evaluate_window(self, batches):
        """Updates the loss and metrics with ``batches`` (a list of (x, y, weight)).

        The last stage computes them; every process returns its results
        (under Horovod with a ``SINK`` entry to drop). The loss adds every
        stage's regularization losses on the batch's micro-batches (each
        weighted by its share of the rows), computed by the stage that ran
        them, as the model adds its ``losses`` on the whole batch.
        """
        pending = []
        for step, (x, y, weight) in enumerate(batches):
            penalties = []
            y_pred = self.forward(x, pending, step * self.strategy.num_microbatches,
                                  penalties)
            penalties = self._inference().share_penalties(
                f"pipeline_eval_penalty_{step}", penalties, y_pred is not None, pending)
            if y_pred is not None:
                self.model.compiled_loss(y, y_pred, weight,
                                         regularization_losses=penalties)
                self.model.compute_metrics(x, y, y_pred, weight)
        return self._inference().share_metrics(self.model, self.strategy.num_stages - 1,
                                               pending)

    def predict_window(self, batches):
        """The model's outputs on ``batches`` in every process, and a sink to drop."""
        pending, outputs = [], []
        for step, (x, _, _) in enumerate(batches):
            y_pred = self.forward(x, pending, step * self.strategy.num_microbatches)
            if y_pred is not None:
                outputs.append(y_pred)
        joined = tf.concat(outputs, axis=0) if outputs else None
        layers = self.layers()
        return self._inference().share_outputs(
            joined, lambda: activation_spec(layers, len(layers),
                                            sum(int(x.shape[0]) for x, _, _ in batches), None),
            self.strategy.num_stages - 1, pending)

    # The model's test and predict functions are Python loops over a window's
    # batches (``steps_per_execution``), each window one traced graph, as for
    # training: Keras's own functions loop in a tf.while_loop, whose
    # iterations would issue Horovod collectives of the same name, and a graph
    # traced per window has static shapes, which a receiving process needs
    # for its placeholders (the last batch is smaller).
    def test_function(self, iterator):
        batches = self._next_window(iterator)
        self._inference().prepare(self.model, batches)
        logs = dict(self._run_window("evaluate", self.evaluate_window, batches))
        logs.pop(SINK, None)  # see tfsparse.distribute._horovod
        count_steps(self.model, "test", len(batches))
        return logs

    def predict_function(self, iterator):
        batches = self._next_window(iterator)
        outputs, _ = self._run_window("predict", self.predict_window, batches)
        count_steps(self.model, "predict", len(batches))
        return outputs

    def _run_window(self, kind, window, batches):
        if self.model.run_eagerly:
            return window(batches)
        if kind not in self._inference_windows:
            self._inference_windows[kind] = tf.function(window, autograph=False)
        return self._inference_windows[kind](batches)
