"""DistributedOptimizer in one process (Horovod size 1); the 2-rank runs are in tests/multiprocess."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.compression import NoCompression
from tfsparse.compression import SIDCo
from tfsparse.compression import TopK
hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")

from tfsparse.horovod import DistributedOptimizer  # noqa: E402  (needs Horovod)


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    assert hvd.size() == 1
    return hvd


def data(seed=0, n=256):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return x, y


def build(optimizer, seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.layers.Dense(16, activation="relu", input_shape=(12,)),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(model, epochs=2, **kwargs):
    x, y = data()
    return model.fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0, **kwargs)


def weights(model):
    return [w.numpy() for w in model.weights]


@pytest.mark.parametrize("compressor", [NoCompression(), TopK(1.0)], ids=["none", "topk_all"])
def test_sending_everything_equals_the_plain_optimizer(compressor):
    plain = build(keras.optimizers.Adam(0.01))
    fit(plain)
    wrapped = build(DistributedOptimizer(keras.optimizers.Adam(0.01), compressor))
    fit(wrapped)
    # Size 1, every element sent: the averaged gradient is the gradient, bit for bit.
    for a, b in zip(weights(plain), weights(wrapped)):
        np.testing.assert_array_equal(a, b)


def test_no_compression_equals_horovod_distributed_optimizer():
    reference = build(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    fit(reference)
    ours = build(DistributedOptimizer(keras.optimizers.SGD(0.1), NoCompression()))
    fit(ours)
    for a, b in zip(weights(reference), weights(ours)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fused", [False, True])
def test_sidco_trains_and_counts_bytes(fused):
    optimizer = DistributedOptimizer(keras.optimizers.Adam(0.01), SIDCo(0.05), fused=fused)
    model = build(optimizer)
    history = fit(model, epochs=4)
    assert history.history["loss"][-1] < 0.8 * history.history["loss"][0]
    stats = {k: float(v.numpy()) for k, v in optimizer.compression_stats.items()}
    parameters = sum(w.shape.num_elements() for w in model.trainable_weights)
    assert stats["elements"] == parameters
    assert stats["dense_bytes"] == 4 * parameters
    assert stats["bytes_sent"] == 8 * stats["selected"]  # float32 value + int32 index
    assert stats["bytes_gathered"] == stats["bytes_sent"]  # one rank
    assert stats["achieved_ratio"] == pytest.approx(stats["selected"] / parameters)
    assert stats["estimation_quality"] == pytest.approx(stats["selected"] / stats["target"])
    assert stats["steps"] == 4 * 8
    assert stats["total_bytes_sent"] == 8 * stats["total_selected"]
    assert 0 < stats["total_bytes_sent"] < 0.2 * stats["total_dense_bytes"]
    assert stats["compression_time"] > 0 and stats["stages"] >= 1
    feedbacks = optimizer.compression_exchange.feedbacks
    assert len(feedbacks) == (1 if fused else len(model.trainable_weights))


def test_resuming_from_a_checkpoint_loses_nothing(tmp_path):
    def make():
        return build(DistributedOptimizer(keras.optimizers.Adam(0.01), SIDCo(0.05)))

    continuous = make()
    fit(continuous, epochs=2)

    first = make()
    fit(first, epochs=1)
    path = tf.train.Checkpoint(model=first, optimizer=first.optimizer).save(str(tmp_path / "ckpt"))
    resumed = make()
    # Restored before the first step: residuals and adaptive stages are created
    # later, in the first apply_gradients, and receive the saved values then.
    status = tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer).restore(path)
    fit(resumed, epochs=1)
    status.assert_consumed()
    for a, b in zip(weights(continuous), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    exchanges = continuous.optimizer.compression_exchange, resumed.optimizer.compression_exchange
    for f1, f2 in zip(exchanges[0].feedbacks, exchanges[1].feedbacks):
        np.testing.assert_array_equal(f1.residuals[0].numpy(), f2.residuals[0].numpy())
        assert int(f1.compressor.stages.numpy()) == int(f2.compressor.stages.numpy())


def test_residuals_are_not_optimizer_variables():
    plain = build(keras.optimizers.Adam(0.01))
    fit(plain, epochs=1)
    wrapped = build(DistributedOptimizer(keras.optimizers.Adam(0.01), SIDCo(0.05)))
    fit(wrapped, epochs=1)
    # Horovod's broadcast callback broadcasts optimizer.variables(); the
    # per-rank residuals must stay out of it.
    assert len(wrapped.optimizer.variables) == len(plain.optimizer.variables)


def test_wrapped_optimizer_keeps_its_class_name_and_config():
    base = keras.optimizers.Adam(0.003, beta_1=0.8)
    wrapped = DistributedOptimizer(base, TopK(0.1))
    assert type(wrapped).__name__ == "Adam"
    assert isinstance(wrapped, keras.optimizers.Adam)
    assert wrapped.get_config() == base.get_config()


def test_legacy_optimizer_and_custom_training_loop():
    optimizer = DistributedOptimizer(keras.optimizers.legacy.SGD(0.1), TopK(0.2))
    model = build(optimizer)
    x, y = data()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step(x[i:i + 32], y[i:i + 32])) for i in range(0, 256, 32) for _ in range(3)]
    assert losses[-1] < losses[0]
    assert float(optimizer.compression_stats["steps"].numpy()) == 24


def _nan_batch():
    x, y = data(n=32)
    x[3, 2] = np.nan
    return x, y


def test_non_finite_gradient_raises_naming_the_variable():
    model = build(DistributedOptimizer(keras.optimizers.SGD(0.1), SIDCo(0.05)))
    x, y = _nan_batch()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Non-finite gradient.*dense.*kernel"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)


@pytest.mark.parametrize("compressor", [SIDCo(0.05), NoCompression()], ids=["sidco", "none"])
def test_non_finite_gradient_skipped_by_option(compressor):
    model = build(DistributedOptimizer(keras.optimizers.SGD(0.1), compressor, nonfinite="skip"))
    before = weights(model)
    x, y = _nan_batch()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    after = weights(model)
    # The NaN input makes the first kernel's gradient non-finite: that gradient
    # sends nothing and plain SGD leaves the kernel as it was. Gradients that
    # stayed finite (ReLU maps NaN to 0 for some units) are applied as usual.
    np.testing.assert_array_equal(before[0], after[0])
    assert all(np.all(np.isfinite(w)) for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before[1:], after[1:]))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: DistributedOptimizer("adam"),
         'Received an invalid value for "optimizer", expected a tf_keras optimizer '
         "(from tfsparse import keras). Received: optimizer='adam'"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), compressor="topk"),
         'Received an invalid value for "compressor", expected a '
         "tfsparse.compression.Compressor. Received: compressor='topk'"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), fused="yes"),
         'Received an invalid value for "fused", expected a bool. Received: fused=\'yes\''),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), nonfinite="zero"),
         'Received an invalid value for "nonfinite", expected one of \'raise\', \'skip\'. '
         "Received: nonfinite='zero'"),
    ],
)
def test_invalid_arguments(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_default_compressor_is_sidco_and_not_shared():
    first = DistributedOptimizer(keras.optimizers.SGD())
    second = DistributedOptimizer(keras.optimizers.SGD())
    x, y = data(n=32)
    first_model = build(first)
    first_model.fit(x, y, verbose=0)
    assert len(first.compression_exchange.feedbacks) == 4
    assert second.compression_exchange.feedbacks == []
    assert isinstance(first.compression_exchange.feedbacks[0].compressor, SIDCo)
    assert first.compression_exchange.feedbacks[0].compressor.ratio == 0.01
