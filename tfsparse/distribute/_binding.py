"""The pipeline of one compiled model: its plan, executor and step functions.

``PipelineStrategy`` attaches a ``Binding`` to every model compiled in its
scope (``model.pipeline``) and points the model's ``make_train_function``,
``test_step`` and ``predict_step`` at it.
"""

import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.distribute import costs as _costs
from tfsparse.distribute._executor import PipelineExecutor
from tfsparse.distribute._executor import lent_rows
from tfsparse.distribute._horovod import SINK
from tfsparse.distribute._validation import invalid
from tfsparse.distribute.stages import StagePlan
from tfsparse.distribute.stages import check_stages
from tfsparse.distribute.stages import plan_stages


class Binding:
    """The pipeline of one compiled model: plan, executor, step functions."""

    def __init__(self, strategy, model):
        self.strategy = strategy
        self.model = model
        self._layers = None
        self._executors = {}
        self._windows = {}
        self._optimizers = None

    # ------------------------------------------------------------ planning
    def layers(self):
        if self._layers is None:
            layers = _costs.chain_layers(self.model)
            stages = self.strategy.num_stages
            if stages > len(layers):
                raise invalid("devices", "at most one device per layer (the model "
                              f"has {len(layers)} layer{'s' * (len(layers) != 1)})",
                              self.strategy.devices)
            self._layers = layers
        return self._layers

    def microbatch_rows(self, batch_size):
        m = self.strategy.num_microbatches
        if batch_size % m:
            raise invalid("num_microbatches", f"a divisor of the batch size "
                          f"({batch_size})", m)
        return batch_size // m

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
        plan = plan_stages(self.costs(rows), self.strategy.num_stages,
                           split=self.strategy.schedule == "layerpipe",
                           splittable=_costs.splittable_layers(layers),
                           stages=self._explicit_stages())
        rounded = tuple(lent_rows(plan, s, rows) / rows for s in range(plan.num_stages))
        return StagePlan(plan.stages, rounded)

    def executor(self, rows):
        if rows not in self._executors:
            plan = self.plan(rows)
            if self._optimizers is None:
                optimizer = self.model.optimizer
                self._optimizers = [type(optimizer).from_config(optimizer.get_config())
                                    for _ in range(self.strategy.num_stages)]
                if isinstance(optimizer, keras.optimizers.Optimizer):
                    # Built before tracing, so the window is traced once.
                    layers = self.layers()
                    for stage_optimizer, group in zip(self._optimizers, plan.stages):
                        stage_optimizer.build([v for i in group
                                               for v in layers[i].trainable_variables])
            self._executors[rows] = PipelineExecutor(
                self.model, self.layers(), plan, self.strategy.devices,
                self._optimizers, self.strategy.schedule,
                self.strategy.num_microbatches, self.strategy.options,
                plan.stage_costs(self.costs(rows)), transport=self._transport())
        return self._executors[rows]

    def _transport(self):
        if self.strategy._horovod is None:
            return None
        from tfsparse.distribute._horovod import HorovodTransport

        return HorovodTransport(self.strategy._horovod)

    @property
    def stage_optimizers(self):
        return self._optimizers

    # ------------------------------------------------------------ training
    def make_train_function(self, force=False):
        return self.train_function

    def train_function(self, iterator):
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
            if not self.model.built:
                self.model.build(x.shape)
            batches.append((x, y, weight))
        rows = self.microbatch_rows(int(tf.nest.flatten(batches[0][0])[0].shape[0]))
        for x, _, _ in batches[1:]:
            self.microbatch_rows(int(x.shape[0]))
        executor = self.executor(rows)
        executor.transport.prepare(self.model, batches)
        if self.model.run_eagerly:
            logs = executor.train_window(batches)
        else:
            if rows not in self._windows:
                # No autograph: the window is straight-line code (the schedule
                # is unrolled in Python), and converting every call it makes
                # multiplies the tracing time.
                self._windows[rows] = tf.function(executor.train_window, autograph=False)
            logs = self._windows[rows](batches)
        self.model.optimizer.iterations.assign_add(len(batches))
        logs = dict(logs)
        logs.pop(SINK, None)  # see tfsparse.distribute._horovod
        return logs

    # --------------------------------------------------- evaluate, predict
    def forward(self, x):
        """The model's output on ``x``, micro-batches pipelined over the stages."""
        layers = self.layers()
        plan_groups = self._explicit_stages() or plan_stages(
            _costs.model_costs(self.model, 1), self.strategy.num_stages).stages
        m = self.strategy.num_microbatches
        rows = tf.shape(x)[0]
        sizes = rows // m + tf.cast(tf.range(m) < rows % m, rows.dtype)
        outputs = []
        for part in tf.split(x, sizes, num=m):
            hidden = part
            for device, group in zip(self.strategy.devices, plan_groups):
                with tf.device(device):
                    for index in group:
                        hidden = layers[index](hidden, training=False)
            outputs.append(hidden)
        return tf.concat(outputs, axis=0)

    def test_step(self, data):
        x, y, weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self.forward(x)
        self.model.compute_loss(x, y, y_pred, weight)
        return self.model.compute_metrics(x, y, y_pred, weight)

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self.forward(x)

