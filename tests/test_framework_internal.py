"""Guards the non-public framework attributes tfsparse reads, all in one file.

Each test checks that the attribute still means what tfsparse relies on, by
the framework's own behaviour, so that an upgrade that moves one fails here
with its name rather than somewhere in a training run.
"""

import ast
import os
import pathlib
import subprocess
import sys

import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_model_optimization as tfmot

from tfsparse import _framework_internal
from tfsparse._framework_internal import optimizer_slot_index
from tfsparse._keras import keras
from tfsparse.horovod import MetricAverageCallback
from tfsparse.layers import SparseDense

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _dense_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_model_level_losses_are_those_added_to_the_model_itself():
    class WithLayerLoss(keras.layers.Dense):
        def call(self, inputs):
            self.add_loss(tf.reduce_sum(self.kernel))
            return super().call(inputs)

    model = keras.Sequential([keras.Input((3,)), WithLayerLoss(2, kernel_regularizer="l2")])
    assert _framework_internal.model_level_losses(model) == []
    model.add_loss(lambda: tf.constant(2.0))
    model_losses = _framework_internal.model_level_losses(model)
    assert len(model_losses) == 1 and float(model_losses[0]()) == 2.0
    # model.losses mixes it with the layer's two (its add_loss and its regularizer).
    assert len(model.losses) == 3


def test_compiled_losses_are_the_losses_given_to_compile_flat():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    absolute = keras.losses.MeanAbsoluteError(reduction="sum")
    model.compile("sgd", {"a": "mse", "b": [absolute, keras.losses.mean_squared_error]})
    assert _framework_internal.compiled_losses(model) == [
        "mse", absolute, keras.losses.mean_squared_error]


def test_adagrad_and_ftrl_accumulators_and_their_initial_value():
    variable = tf.Variable(tf.ones([3]))
    for make in (keras.optimizers.Adagrad, keras.optimizers.Ftrl):
        optimizer = make(0.1, initial_accumulator_value=0.3)
        assert _framework_internal.accumulator_slots(optimizer) == []
        optimizer.apply_gradients([(tf.zeros([3]), variable)])
        (slot,) = _framework_internal.accumulator_slots(optimizer)
        np.testing.assert_allclose(slot.numpy(), 0.3)
    for make in (keras.optimizers.legacy.Adagrad, keras.optimizers.legacy.Ftrl):
        optimizer = make(0.1, initial_accumulator_value=0.3)
        assert _framework_internal.legacy_initial_accumulator_value(optimizer) == 0.3


def test_graph_networks_are_the_models_keras_can_clone():
    inputs = keras.Input((3,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))

    class Subclassed(keras.Model):
        def call(self, inputs):
            return inputs

    assert _framework_internal.is_graph_network(functional)
    assert _framework_internal.is_graph_network(_dense_model())
    assert not _framework_internal.is_graph_network(Subclassed())


@pytest.mark.parametrize("kind", ["train", "test", "predict"])
def test_step_counters_are_the_ones_keras_advances(kind):
    model = _dense_model()
    x, y = np.ones((12, 3), np.float32), np.ones((12, 1), np.float32)
    run = {"train": lambda: model.fit(x, y, batch_size=4, verbose=0),
           "test": lambda: model.evaluate(x, y, batch_size=4, verbose=0),
           "predict": lambda: model.predict(x, batch_size=4, verbose=0)}
    run[kind]()  # 3 steps of Keras's own step function
    assert int(_framework_internal.count_steps(model, kind, 0)) == 3
    assert int(_framework_internal.count_steps(model, kind, 2)) == 5


def test_steps_per_execution_is_what_fit_runs_per_execution():
    model = _dense_model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    seen = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: seen.append(
        _framework_internal.steps_per_execution(model)))
    # 5 batches: two executions of 2 steps, then fit shortens the last one to 1.
    model.fit(np.ones((10, 3)), np.ones((10, 1)), batch_size=2, verbose=0, callbacks=[callback])
    assert seen == [2, 2, 1]
    assert int(model.optimizer.iterations.numpy()) == 5


def test_horovod_callbacks_compute_with_the_backend_they_are_handed():
    hvd_keras.init()
    stock = hvd_keras.callbacks.MetricAverageCallback()
    assert "backend" in vars(stock)
    callback = MetricAverageCallback()
    assert callback.backend is keras.backend
    callback.set_model(_dense_model())
    logs = {"loss": 2.5}
    callback.on_epoch_end(0, logs)  # averages over the one rank with tf_keras's backend
    assert logs == {"loss": pytest.approx(2.5)}


def test_a_callback_without_a_backend_attribute_fails_loudly():
    with pytest.raises(AttributeError, match="keeps no `backend` attribute"):
        _framework_internal.set_horovod_callback_backend(keras.callbacks.Callback(), keras.backend)


# Importing tfsparse picks Keras 2; the probe loads _framework_internal.py by
# itself, so that it sees TensorFlow's loader as a user's process has it.
_PROBE = """
import importlib.util
import tensorflow as tf
spec = importlib.util.spec_from_file_location("framework_internal", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
loader = vars(tf)["keras"]
assert type(loader).__name__ == "KerasLazyLoader", type(loader)
assert vars(loader)["_tfll_initialized"] is False
before = module.tf_keras_resolved_to_keras_3(tf)
tf.keras.layers.Dense
print(before, module.tf_keras_resolved_to_keras_3(tf))
"""


@pytest.mark.parametrize("legacy,after", [(None, True), ("1", False)])
def test_tensorflow_lazy_keras_loader_is_read_without_resolving_it(legacy, after):
    environment = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environment["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if legacy is not None:
        environment["TF_USE_LEGACY_KERAS"] = legacy
    code = _PROBE.format(path=str(ROOT / "tfsparse" / "_framework_internal.py"))
    result = subprocess.run([sys.executable, "-c", code], env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", str(after)]


def test_optimizer_slot_index_finds_the_slots_of_each_variable():
    a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    optimizer = keras.optimizers.Adam(0.1)
    assert optimizer_slot_index(optimizer, a) is None  # before the slots exist
    optimizer.apply_gradients([(tf.ones(2), a), (tf.ones(1), b)])
    index_a, count = optimizer_slot_index(optimizer, a)
    index_b, _ = optimizer_slot_index(optimizer, b)
    assert count == 2 and {index_a, index_b} == {0, 1}
    # Adam's first moments, in that order: one step of gradient 1 gives (1 - beta_1) * 1.
    assert optimizer._momentums[index_b].shape == (1,)
    np.testing.assert_allclose(optimizer._momentums[index_a].numpy(), [0.1, 0.1], rtol=1e-6)


def test_sparse_dense_is_prunable_through_tfmots_public_class():
    assert issubclass(SparseDense, tfmot.sparsity.keras.PrunableLayer)


# Names that only tfsparse/_framework_internal.py may read.
_PRIVATE_NAMES = {
    "_callable_losses", "_is_graph_network", "_train_counter", "_test_counter",
    "_predict_counter", "_tfll_initialized", "_tfll_keras_version", "backend",
    "_index_dict", "_var_key", "_steps_per_execution", "_cached_value", "_caching_device",
}
_INTERNAL_FILES = {"tfsparse/_framework_internal.py", "tfsparse/ops/_tf_internal.py"}


def _private_uses(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            modules = []
        for module in modules:
            if (module.startswith(("tensorflow.python", "tensorflow_model_optimization.python",
                                   "horovod._", "tf_keras.src", "keras.src"))):
                yield node.lineno, module
        if isinstance(node, ast.Attribute) and node.attr in _PRIVATE_NAMES:
            if not (node.attr == "backend" and isinstance(node.ctx, ast.Load)):
                yield node.lineno, node.attr
        if isinstance(node, ast.Constant) and node.value in _PRIVATE_NAMES - {"backend"}:
            yield node.lineno, node.value


def test_framework_internals_are_read_in_one_module_only():
    sources = [path for folder in ("tfsparse", "callbacks")
               for path in sorted((ROOT / folder).rglob("*.py"))]
    uses = [f"{path.relative_to(ROOT)}:{line}: {name}"
            for path in sources if str(path.relative_to(ROOT)) not in _INTERNAL_FILES
            for line, name in _private_uses(path)]
    assert uses == []


def test_nested_inputs_outputs_are_the_structures_the_model_was_built_with():
    a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model({"b": b, "a": a}, {"z": keras.layers.Dense(1)(joined), "y": joined})
    inputs, outputs = _framework_internal.nested_inputs_outputs(model)
    assert inputs == {"a": a, "b": b}
    assert outputs["y"] is joined and set(outputs) == {"y", "z"}
    # Flattened (by sorted key) in model.inputs / model.outputs.
    assert model.outputs == [outputs["y"], outputs["z"]]

