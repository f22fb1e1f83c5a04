"""PipelineStrategy on the default CPU device: arguments, simulate, training."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.distribute import PipelineStrategy

X = np.random.default_rng(0).normal(size=(16, 5)).astype("float32")
Y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")


def chain():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(2)])


def pipelined(strategy, optimizer="sgd", **compile_kwargs):
    model = chain()
    model.compile(optimizer, "mse", **compile_kwargs)
    return strategy.attach(model)


def test_one_stage_gpipe_equals_plain_training():
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=4, schedule="gpipe")
    model = pipelined(strategy, keras.optimizers.SGD(0.1))
    model.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    plain = chain()
    plain.compile(keras.optimizers.SGD(0.1), "mse")
    plain.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    # Mean of 4 micro-batch mean gradients vs one batch mean: float32 rounding.
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_simulate_uses_the_executed_plan_and_explicit_stages():
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2, schedule="pipedream",
                                costs=[(1, 0, 1), (1, 1, 1)])
    model = pipelined(strategy)
    result = strategy.simulate(model, batch_size=8, steps=3)
    assert result.plan.stages == ((0, 1),)
    assert result.cycles == 3 * 2 * 5  # one stage: every action in turn
    # 7 rows: micro-batches of 4 and 3, as fit cuts them; 1 row: one.
    assert strategy.simulate(model, batch_size=7, steps=3).schedule.num_microbatches == 2
    assert strategy.simulate(model, batch_size=1).schedule.num_microbatches == 1
    with pytest.raises(ValueError, match='"batch_size", expected a positive int'):
        strategy.simulate(model, batch_size=0)
    with pytest.raises(ValueError, match='"model", expected a model attached to this '
                       r'strategy \(strategy.attach\(model\) after model.compile\)'):
        strategy.simulate(chain(), batch_size=8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(schedule="gpipe", min_update_interval=2),
     'Received an invalid value for "min_update_interval", expected None unless '
     'schedule="async". Received: min_update_interval=2'),
    (dict(num_microbatches=0),
     'Received an invalid value for "num_microbatches", expected a positive integer. '
     "Received: num_microbatches=0"),
    (dict(stages=[[0], [1]]),
     'Received an invalid value for "stages", expected one list of layers per device (1). '
     "Received: stages=[[0], [1]]"),
    (dict(devices="/cpu:0"),
     'Received an invalid value for "devices", expected a non-empty list of device '
     "names. Received: devices='/cpu:0'"),
    (dict(costs=[(1, 1)]),
     'Received an invalid value for "costs", expected a non-empty list of (forward, '
     "backward_input, backward_weight) tuples of finite non-negative numbers. "
     "Received: costs=[(1, 1)]"),
])
def test_bad_constructor_arguments(kwargs, message):
    arguments = dict(devices=["/cpu:0"])
    arguments.update(kwargs)
    with pytest.raises(ValueError) as error:
        PipelineStrategy(**arguments)
    assert str(error.value) == message


def test_costs_for_the_wrong_number_of_layers():
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2, costs=[(1, 1, 1)])
    model = pipelined(strategy)
    with pytest.raises(ValueError, match=r'"costs", expected one triple per layer \(2\)'):
        model.fit(X, Y, batch_size=8, verbose=0)


def test_a_loss_added_to_the_model_itself_is_refused_not_dropped():
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2)
    model = chain()
    model.add_loss(lambda: tf.reduce_sum(model.layers[0].kernel))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError) as info:
        strategy.attach(model)
    assert str(info.value) == (
        'Received an invalid value for "model", expected no loss added to the model itself '
        "(PipelineStrategy adds the losses of the model's layers, their regularizers and "
        "add_loss calls, to the training loss: add it from a layer's call() or as a layer's "
        "regularizer instead). Received: a model with 1 model.add_loss loss(es)")


@pytest.mark.parametrize("loss", [
    keras.losses.MeanSquaredError(reduction="sum"),
    {"dense_1": keras.losses.MeanAbsoluteError(reduction="none")},
])
def test_a_loss_that_does_not_average_over_the_batch_is_refused(loss):
    # Before, a sum came out num_microbatches times too small (the pipeline
    # averages the micro-batches): loss 1.40 against 4.69, silently.
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=4, schedule="gpipe")
    model = chain()
    model.compile("sgd", loss)
    with pytest.raises(ValueError, match=r"expected a model compiled with losses that average "
                                         r"over the batch .* with reduction '(sum|none)'"):
        strategy.attach(model)


@pytest.mark.parametrize("loss", ["mse", keras.losses.MeanSquaredError(),
                                  keras.losses.MeanSquaredError(reduction="sum_over_batch_size"),
                                  [keras.losses.mean_squared_error]])
def test_losses_averaging_over_the_batch_are_attached(loss):
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2)
    model = chain()
    model.compile("sgd", loss)
    assert strategy.attach(model) is model


def test_horovod_devices_need_hvd_init():
    pytest.importorskip("horovod.tensorflow")
    # In a fresh process: other test modules initialise Horovod in this one.
    code = (
        "from tfsparse.distribute import PipelineStrategy\n"
        "try:\n"
        "    PipelineStrategy(devices='horovod')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r'"devices", expected "horovod" after hvd.init\(\)', result.stdout), result.stdout


def test_pipelined_model_exports_a_saved_model(tmp_path):
    import tensorflow as tf

    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2, schedule="layerpipe")
    model = pipelined(strategy, keras.optimizers.SGD(0.1))
    model.fit(X, Y, batch_size=8, verbose=0)
    model.save(str(tmp_path / "saved"), save_format="tf")
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_allclose(loaded(X).numpy(), model.predict(X, verbose=0),
                               rtol=1e-6, atol=1e-6)


@pytest.fixture
def mixed_precision():
    def set_policy(name):
        keras.mixed_precision.set_global_policy(name)

    yield set_policy
    keras.mixed_precision.set_global_policy(None)  # back to floatx, as when unset


def test_loss_scaling_is_refused_not_applied_wrongly(mixed_precision):
    # mixed_float16 wraps the optimizer in a LossScaleOptimizer, whose update
    # divides by a loss scale the pipeline never multiplied in.
    mixed_precision("mixed_float16")
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2, schedule="gpipe")
    with pytest.raises(ValueError) as error:
        pipelined(strategy, keras.optimizers.SGD(0.1))
    assert str(error.value).startswith(
        'Received an invalid value for "optimizer", expected an optimizer without loss '
        'scaling: PipelineStrategy does not scale losses; use the "mixed_bfloat16" policy')


@pytest.mark.parametrize("optimizer,expected", [
    (lambda: keras.optimizers.Adam(global_clipnorm=0.02), "without global_clipnorm"),
    (lambda: keras.optimizers.legacy.SGD(0.1, global_clipnorm=0.02),
     "without global_clipnorm"),
    (lambda: keras.optimizers.SGD(0.1, use_ema=True), "without use_ema"),
    (lambda: keras.optimizers.Nadam(), "other than the new Nadam"),
])
def test_optimizer_settings_the_stages_cannot_honour_are_refused(optimizer, expected):
    # Before: global_clipnorm clipped each stage by its own norm and the new
    # Nadam stepped differently (weights 1e-3 to 6e-3 off plain Keras,
    # silently); use_ema crashed at the end of fit.
    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2, schedule="gpipe")
    with pytest.raises(ValueError, match=f'"optimizer", expected an optimizer {expected}'):
        pipelined(strategy, optimizer())
    plain = pipelined(strategy, keras.optimizers.legacy.Nadam())  # trains as without one
    plain.fit(X, Y, batch_size=8, verbose=0)


def test_mixed_bfloat16_gpipe_equals_plain_training(mixed_precision):
    mixed_precision("mixed_bfloat16")
    runs = []
    for attached in (True, False):
        strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=4, schedule="gpipe")
        model = chain()
        model.compile(keras.optimizers.SGD(0.1), "mse")
        if attached:
            strategy.attach(model)
        model.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append(model.get_weights())
    assert model.layers[0].compute_dtype == "bfloat16"
    # bfloat16 activations and gradients (relative rounding 2^-8) summed per
    # micro-batch instead of per batch: each of the 4 SGD steps (lr 0.1, O(1)
    # gradients) may move a weight differently by 0.1 * 2^-8 = 4e-4.
    for a, b in zip(*runs):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=0, atol=4 * 0.1 * 2.0 ** -8)


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise KeyboardInterrupt


@pytest.mark.parametrize("schedule", ["1f1b", "pipedream"])
def test_backup_and_restore_resumes_the_stage_optimizers_exactly(tmp_path, schedule):
    # Each stage updates with its own copy of the optimizer: the model tracks
    # them, so the backup holds their Adam moments and step counts, and the
    # resumed run is bit for bit the uninterrupted one.
    def build():
        strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2,
                                    schedule=schedule)
        return pipelined(strategy, keras.optimizers.Adam(0.01), steps_per_execution=2)

    straight = build()
    straight.fit(X, Y, batch_size=4, epochs=4, shuffle=False, verbose=0)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    for attempt in (0, 1):
        resumed = build()
        try:
            resumed.fit(X, Y, batch_size=4, epochs=4, shuffle=False, verbose=0,
                        callbacks=[backup] + ([_Interrupt()] if attempt == 0 else []))
        except KeyboardInterrupt:
            assert attempt == 0
    assert [int(o.iterations.numpy()) for o in resumed.pipeline.stage_optimizers] == [16]
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_array_equal(a, b)
