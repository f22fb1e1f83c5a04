"""DistributedOptimizer in one process (Horovod size 1); the 2-rank runs are in tests/multiprocess."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.compression import NoCompression
from tfsparse.compression import SIDCo
from tfsparse.compression import TopK
hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")
import horovod.tensorflow as hvd_tf  # noqa: E402  (Adasum, Max: not re-exported by the Keras module)

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


@pytest.mark.parametrize("adam,passes", [
    (keras.optimizers.Adam, 1), (keras.optimizers.legacy.Adam, 1),
    (keras.optimizers.legacy.Adam, 2)], ids=["adam", "legacy_adam", "legacy_adam_2_passes"])
def test_resuming_from_a_checkpoint_loses_nothing(tmp_path, adam, passes):
    # A legacy optimizer does not track its attributes: before, its
    # checkpoint held no residual and no pass sum (weights 0.02 off).
    def make():
        return build(DistributedOptimizer(adam(0.01), SIDCo(0.05),
                                          backward_passes_per_step=passes))

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
    saved = " ".join(name for name, _ in tf.train.list_variables(path))
    assert "_tfsparse_exchange/residuals" in saved
    assert ("_tfsparse_accumulator" in saved) == (passes > 1)


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


def token_data():
    rng = np.random.default_rng(6)
    return rng.integers(0, 40, size=(64, 3)).astype(np.int32), rng.normal(size=(64, 1)).astype(np.float32)


@pytest.mark.parametrize("compression", [NoCompression(), TopK(1.0)], ids=["none", "topk_all"])
def test_embedding_gradients_stay_row_sparse_as_in_horovod(compression, embedding_model):
    # Legacy SGD with momentum updates only the rows of an IndexedSlices gradient
    # (their momentum too); a densified gradient would move every row that has
    # momentum, so equal weights show the rows arrived as IndexedSlices.
    def sgd():
        return keras.optimizers.legacy.SGD(0.1, momentum=0.9)

    x, y = token_data()
    reference = embedding_model(hvd.DistributedOptimizer(sgd()), vocabulary=50)
    reference.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    ours = embedding_model(DistributedOptimizer(sgd(), compression), vocabulary=50)
    ours.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    # Rows 40..49 get no gradient and stay as they were.
    np.testing.assert_array_equal(ours.layers[0].embeddings.numpy()[40:],
                                  reference.layers[0].embeddings.numpy()[40:])
    # TopK sums a repeated token's rows before the update, Horovod's SGD adds them
    # one by one: float32 sums of a few O(0.1) terms differ by an ulp or two.
    for a, b in zip(weights(reference), weights(ours)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@tf.custom_gradient
def _nan_gradient(kernel):
    """Identity whose gradient is NaN: which gradient is non-finite is the test's choice."""
    def gradient(upstream):
        return tf.fill(tf.shape(upstream), np.float32(np.nan))
    return tf.identity(kernel), gradient


class PoisonedDense(keras.layers.Dense):
    """A Dense layer whose kernel gets a NaN gradient; every other gradient stays finite.

    The forward pass is finite and the other gradients read the kernel's value,
    not its gradient, so no CPU's NaN propagation (ReLU keeps NaN on some
    x86-64 CPUs and maps it to 0 on others) decides which variables are hit.
    """

    def call(self, inputs):
        return self.activation(tf.matmul(inputs, _nan_gradient(self.kernel)) + self.bias)


def relu_keeping_nan(x):
    """ReLU as TensorFlow computes it on CPUs without AVX-512 (issue 13): NaN stays NaN."""
    return tf.where(tf.math.is_nan(x), x, tf.nn.relu(x))


def build_poisoned(optimizer, activation="relu", seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        PoisonedDense(16, activation=activation, input_shape=(12,), name="poisoned"),
        keras.layers.Dense(2, name="clean"),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_non_finite_gradient_raises_naming_the_variable():
    model = build_poisoned(DistributedOptimizer(keras.optimizers.SGD(0.1), SIDCo(0.05)))
    x, y = data(n=32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Non-finite gradient \(NaN or Inf\) for variable poisoned/kernel:0"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)


@pytest.mark.parametrize("activation", ["relu", relu_keeping_nan], ids=["relu", "relu_keeping_nan"])
@pytest.mark.parametrize("compression", [SIDCo(0.05), NoCompression()], ids=["sidco", "none"])
def test_non_finite_gradient_skipped_by_option(compression, activation):
    # Which gradient is non-finite is set by the test, not by how the CPU's
    # ReLU treats NaN: the result is the same under both ReLU behaviours.
    model = build_poisoned(DistributedOptimizer(keras.optimizers.SGD(0.1), compression,
                                                nonfinite="skip"), activation)
    x, y = data(n=32)
    with tf.GradientTape() as tape:
        loss = model.loss(y, model(x, training=True))
    gradients = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
    assert not np.isfinite(gradients[0]).any() and all(np.isfinite(g).all() for g in gradients[1:])
    before = weights(model)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    after = weights(model)
    # Only the poisoned kernel is skipped: plain SGD leaves it as it was ...
    np.testing.assert_array_equal(before[0], after[0])
    if isinstance(compression, NoCompression):
        # ... and applies every other gradient in full (size 1): w - 0.1 g, up to
        # float32 rounding of the same gradient computed in fit (a few ulps).
        for w0, w1, g in zip(before[1:], after[1:], gradients[1:]):
            np.testing.assert_allclose(w1, w0 - np.float32(0.1) * g, rtol=1e-6, atol=1e-7)
    else:
        # ... its residual stays empty, and every other variable sends something.
        residual = optimizer_feedbacks(model)[0].residuals[0].numpy()
        np.testing.assert_array_equal(residual, np.zeros_like(residual))
        assert all(not np.array_equal(a, b) for a, b in zip(before[1:], after[1:]))


def optimizer_feedbacks(model):
    return model.optimizer.compression_exchange.feedbacks


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: DistributedOptimizer("adam"),
         'Received an invalid value for "optimizer", expected a tf_keras optimizer '
         "(from tfsparse import keras). Received: optimizer='adam'"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), compression="topk"),
         'Received an invalid value for "compression", expected a '
         "tfsparse.compression.Compressor. Received: compression='topk'"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), compression=hvd.Compression.fp16),
         'Received an invalid value for "compression", expected a '
         "tfsparse.compression.Compressor. Received: compression="
         "<class 'horovod.tensorflow.compression.FP16Compressor'>"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), TopK(0.1), compressor=TopK(0.2)),
         'Received both "compression" and its deprecated alias "compressor"; pass compression '
         "only. Received: compression=TopK(ratio=0.1), compressor=TopK(ratio=0.2)"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), op=hvd_tf.Adasum),
         'Received an invalid value for "op", expected hvd.Average or hvd.Sum (Adasum combines '
         "whole dense gradients by their dot products, which sparse payloads and error feedback "
         "do not preserve; use Horovod's hvd.DistributedOptimizer(op=hvd.Adasum) for it). "
         "Received: op=hvd.Adasum"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), op=hvd_tf.Max),
         'Received an invalid value for "op", expected hvd.Average or hvd.Sum. Received: op=hvd.Max'),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), op="average"),
         'Received an invalid value for "op", expected hvd.Average or hvd.Sum. '
         "Received: op='average'"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0),
         'Received an invalid value for "backward_passes_per_step", expected a positive integer. '
         "Received: backward_passes_per_step=0"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), average_aggregated_gradients=1),
         'Received an invalid value for "average_aggregated_gradients", expected a bool. '
         "Received: average_aggregated_gradients=1"),
        (lambda: DistributedOptimizer(keras.optimizers.SGD(), sparse_as_dense=None),
         'Received an invalid value for "sparse_as_dense", expected a bool. '
         "Received: sparse_as_dense=None"),
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


def test_default_is_no_compression_as_in_horovod():
    # Horovod's DistributedOptimizer sends gradients uncompressed unless asked.
    reference = build(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    fit(reference)
    ours = build(DistributedOptimizer(keras.optimizers.SGD(0.1)))
    fit(ours)
    assert ours.optimizer.compression_exchange.sends_dense
    assert ours.optimizer.compression_exchange.feedbacks == []
    for a, b in zip(weights(reference), weights(ours)):
        np.testing.assert_array_equal(a, b)
    horovod_none = build(DistributedOptimizer(keras.optimizers.SGD(0.1),
                                              compression=hvd.Compression.none))
    fit(horovod_none)
    for a, b in zip(weights(reference), weights(horovod_none)):
        np.testing.assert_array_equal(a, b)


def test_deprecated_compressor_alias_warns_and_behaves_as_compression():
    with pytest.warns(DeprecationWarning, match='"compressor" argument is deprecated'):
        old = DistributedOptimizer(keras.optimizers.SGD(0.1), compressor=SIDCo(0.05))
    new = DistributedOptimizer(keras.optimizers.SGD(0.1), compression=SIDCo(0.05))
    old_model, new_model = build(old), build(new)
    fit(old_model, epochs=1)
    fit(new_model, epochs=1)
    for a, b in zip(weights(old_model), weights(new_model)):
        np.testing.assert_array_equal(a, b)


def test_compressor_is_cloned_not_shared():
    template = SIDCo(0.01)
    first = DistributedOptimizer(keras.optimizers.SGD(), compression=template)
    second = DistributedOptimizer(keras.optimizers.SGD(), compression=template)
    x, y = data(n=32)
    build(first).fit(x, y, verbose=0)
    assert len(first.compression_exchange.feedbacks) == 4
    assert second.compression_exchange.feedbacks == []
    compressors = [f.compressor for f in first.compression_exchange.feedbacks]
    assert all(isinstance(c, SIDCo) and c.ratio == 0.01 and c is not template for c in compressors)
