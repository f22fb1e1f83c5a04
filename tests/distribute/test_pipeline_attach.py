"""PipelineStrategy.attach: per model, refused overrides, detached by compile."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.distribute import PipelineStrategy
from tfsparse.distribute._binding import STEP_METHODS

X = np.random.default_rng(0).normal(size=(16, 5)).astype("float32")
Y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")


def chain(model_class=keras.Model):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    return model_class(inputs, keras.layers.Dense(2)(hidden))


def strategy():
    return PipelineStrategy(devices=["/cpu:0"], num_microbatches=4, schedule="gpipe")


def fit(model, epochs=1):
    return model.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)


def plain_fit(weights, epochs=1):
    model = chain()
    model.set_weights(weights)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    fit(model, epochs)
    return model


def class_attributes():
    return {cls: dict(vars(cls)) for cls in (keras.Model, keras.Sequential,
                                             keras.layers.Layer)}


def test_attach_touches_no_class_and_no_model_of_another_thread():
    before = class_attributes()
    attached, other = chain(), chain()
    start = other.get_weights()
    seen = {}
    ready, done = threading.Event(), threading.Event()

    def pipeline_thread():
        attached.compile(keras.optimizers.SGD(0.1), "mse")
        strategy().attach(attached)
        ready.set()
        done.wait(timeout=300)
        fit(attached)
        seen["stage_iterations"] = [
            int(o.iterations.numpy()) for o in attached.pipeline.stage_optimizers]

    def plain_thread():
        ready.wait(timeout=300)
        # Compiled and trained while the other thread's model is attached.
        other.compile(keras.optimizers.SGD(0.1), "mse")
        fit(other)
        seen["other_pipeline"] = hasattr(other, "pipeline")
        done.set()

    threads = [threading.Thread(target=pipeline_thread), threading.Thread(target=plain_thread)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert class_attributes() == before
    assert seen == {"other_pipeline": False, "stage_iterations": [2]}
    # The other model trained as plain Keras: the same ops in the same order
    # as plain_fit, so the same float32 weights.
    for a, b in zip(other.get_weights(), plain_fit(start).get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("method", STEP_METHODS)
def test_a_model_that_overrides_a_step_is_refused(method):
    def override(self, *args, **kwargs):
        raise AssertionError("never called")

    custom = type("CustomModel", (keras.Model,), {method: override})
    model = chain(custom)
    model.compile("sgd", "mse")
    with pytest.raises(ValueError) as error:
        strategy().attach(model)
    assert str(error.value) == (
        'Received an invalid value for "model", expected a model that does not override '
        f"{', '.join(STEP_METHODS)} (the pipeline runs its own steps, which would bypass "
        f"them). Received: model='CustomModel overriding {method}'")
    assert not hasattr(model, "pipeline")


def test_attach_needs_a_compiled_model():
    model = chain()
    with pytest.raises(ValueError) as error:
        strategy().attach(model)
    assert str(error.value) == (
        'Received an invalid value for "model", expected a compiled model (call '
        f"model.compile, then strategy.attach(model)). Received: model={model.name!r}")


def checkpoint_keys(model, path):
    model.save_weights(str(path))
    return [name for name, _ in tf.train.list_variables(str(path))]


def test_compiling_again_detaches_and_trains_as_plain_keras(tmp_path):
    pipeline = strategy()
    model = chain()
    model.compile(keras.optimizers.Adam(0.01), "mse")
    pipeline.attach(model)
    fit(model)
    assert model.pipeline.attached
    assert any("pipeline_optimizers" in key
               for key in checkpoint_keys(model, tmp_path / "attached"))

    model.compile(keras.optimizers.SGD(0.1), "mse")
    assert not hasattr(model, "pipeline")
    assert "compile" not in vars(model) and "pipeline_optimizers" not in vars(model)
    start = model.get_weights()
    fit(model, epochs=2)
    for a, b in zip(model.get_weights(), plain_fit(start, epochs=2).get_weights()):
        np.testing.assert_array_equal(a, b)  # plain Keras, the same ops
    assert not any("pipeline" in key for key in checkpoint_keys(model, tmp_path / "plain"))
    with pytest.raises(ValueError, match='"model", expected a model attached'):
        pipeline.simulate(model, batch_size=8)

    # Attached again, it is pipelined again, its stage optimizer stepping on
    # from the plain SGD's 4 steps (as Keras keeps an optimizer's state).
    pipeline.attach(model)
    fit(model)
    assert [int(o.iterations.numpy()) for o in model.pipeline.stage_optimizers] == [6]
