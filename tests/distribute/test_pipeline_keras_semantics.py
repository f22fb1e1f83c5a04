"""A pipelined fit keeps what plain Keras's keeps, or refuses what it cannot.

One device and four micro-batches: the stages' optimizer copies, the
micro-batch split and the step counters are those of any pipeline. Each
case failed before (found by a helper's sweep): silent differences of
1e-3 to 0.1 in the weights, or TensorFlow's errors.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.distribute import PipelineStrategy

X = np.random.default_rng(0).normal(size=(48, 6)).astype("float32")
Y = np.random.default_rng(1).normal(size=(48, 3)).astype("float32")
# float32 updates of O(0.1) weights over a few steps, two orders of the sums.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def chain(*middle, activity_regularizer=None):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)),
                             keras.layers.Dense(8, activation="tanh",
                                                activity_regularizer=activity_regularizer),
                             *middle, keras.layers.Dense(3)])


def strategy():
    return PipelineStrategy(devices=["/cpu:0"], num_microbatches=4, schedule="gpipe")


def fit(model, epochs=1, **kwargs):
    return model.fit(X, Y, batch_size=12, epochs=epochs, shuffle=False, verbose=0, **kwargs)


def trained(optimizer, attach, epochs=2, make=chain, **kwargs):
    model = make()
    model.compile(optimizer, "mse")
    if attach:
        strategy().attach(model)
    fit(model, epochs, **kwargs)
    return model


def assert_same_weights(a, b):
    for got, want in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(got, want, **TOLERANCE)


def test_learning_rates_set_by_callbacks_and_users_reach_the_stages():
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05 / (1 + epoch))
    plain = trained(keras.optimizers.Adam(0.05), False, 3, callbacks=[schedule])
    piped = trained(keras.optimizers.Adam(0.05), True, 3, callbacks=[schedule])
    assert_same_weights(piped, plain)
    piped.optimizer.learning_rate = 0.0
    before = piped.get_weights()
    fit(piped)
    for got, want in zip(piped.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_adamw_leaves_the_excluded_variables_undecayed():
    def adamw():
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        return optimizer

    assert_same_weights(trained(adamw(), True), trained(adamw(), False))


def test_training_steps_are_counted_as_keras_counts_them():
    model = trained(keras.optimizers.SGD(0.1), True)
    assert int(model._train_counter.numpy()) == 8


def test_an_activity_regularizer_trains_as_in_plain_keras():
    def make():
        return chain(activity_regularizer=keras.regularizers.L2(0.1))

    assert_same_weights(trained(keras.optimizers.SGD(0.1), True, make=make),
                        trained(keras.optimizers.SGD(0.1), False, make=make))


def test_a_trainable_batch_normalization_is_refused_and_a_frozen_one_runs():
    with pytest.raises(ValueError, match=r"trainable BatchNormalization.*num_microbatches=4"):
        trained(keras.optimizers.SGD(0.1), True,
                make=lambda: chain(keras.layers.BatchNormalization()))

    def frozen():
        return chain(keras.layers.BatchNormalization(trainable=False))

    assert_same_weights(trained(keras.optimizers.SGD(0.1), True, make=frozen),
                        trained(keras.optimizers.SGD(0.1), False, make=frozen))


def test_models_and_data_the_pipeline_cannot_cut_are_refused():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8)(inputs)
    two_outputs = keras.Model(inputs, [keras.layers.Dense(3)(hidden), hidden])
    two_outputs.compile("sgd", "mse")
    with pytest.raises(ValueError, match="the model's only output"):
        strategy().attach(two_outputs)
    model = chain()
    model.compile("sgd", "mse")
    strategy().attach(model)
    with pytest.raises(ValueError, match=r'"x", expected a single tensor.*dict'):
        model.fit({"x": X}, Y, batch_size=12, verbose=0)
    with pytest.raises(ValueError, match=r'"y", expected a single tensor.*dict'):
        model.evaluate(X, {"y": Y}, batch_size=12, verbose=0)


def test_the_stages_optimizer_state_carries_over_or_attaching_is_refused():
    plain = trained(keras.optimizers.Adam(0.05), False)
    pipeline = strategy()
    optimizer = keras.optimizers.Adam(0.05)
    model = chain()
    model.compile(optimizer, "mse")
    pipeline.attach(model)
    fit(model)
    model.compile(optimizer, "mse")  # the same optimizer: Keras keeps its state
    pipeline.attach(model)
    fit(model)
    assert_same_weights(model, plain)
    pipeline.attach(model)  # again, without compiling
    fit(model)
    assert_same_weights(model, trained(keras.optimizers.Adam(0.05), False, 3))
    # Another strategy: its stages take over the last ones' state.
    strategy().attach(model)
    fit(model)
    assert_same_weights(model, trained(keras.optimizers.Adam(0.05), False, 4))
    model.compile(keras.optimizers.Adam(0.05), "mse")  # a new optimizer: fresh state
    strategy().attach(model)
    # Plain Keras training, then pipelined: the stages take over its state.
    strategy().attach(plain)
    fit(plain)
    assert_same_weights(plain, trained(keras.optimizers.Adam(0.05), False, 3))
    assert [int(o.iterations.numpy()) for o in plain.pipeline.stage_optimizers] == [12]
    # Pipelined, then plain steps with the same optimizer, then the same
    # pipeline: the stages take over the plain steps' state, not their own
    # older one.
    optimizer = keras.optimizers.Adam(0.05)
    mixed = chain()
    mixed.compile(optimizer, "mse")
    pipeline.attach(mixed)
    fit(mixed)
    mixed.compile(optimizer, "mse")
    fit(mixed)
    pipeline.attach(mixed)
    fit(mixed)
    assert_same_weights(mixed, trained(keras.optimizers.Adam(0.05), False, 3))
    legacy = trained(keras.optimizers.legacy.Adam(0.05), False, 1)
    with pytest.raises(ValueError, match=r"not a legacy one.*\(Adam\) after 4 step"):
        strategy().attach(legacy)
    # A legacy optimizer's stages cannot hand their state to another strategy.
    legacy = chain()
    legacy.compile(keras.optimizers.legacy.Adam(0.05), "mse")
    strategy().attach(legacy)
    fit(legacy)
    with pytest.raises(ValueError, match=r"\(Adam\) after 4 step"):
        strategy().attach(legacy)
