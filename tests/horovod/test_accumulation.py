"""backward_passes_per_step: GradientAccumulator and DistributedOptimizer at Horovod size 1.

The 2-rank runs (one exchange of the summed passes) are in tests/multiprocess.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import keras
from tfsparse.compression import NoCompression
from tfsparse.compression import TopK

hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")

from tfsparse.horovod import DistributedOptimizer  # noqa: E402  (needs Horovod)
from tfsparse.horovod import GradientAccumulator  # noqa: E402

LEARNING_RATE = 0.05


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    assert hvd.size() == 1


def regression_data(n=96):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.normal(size=(n, 3)).astype(np.float32)
    return x, y


def linear_model(optimizer):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Dense(3, input_shape=(4,))])
    model.compile(optimizer, "mse")
    return model


def reference_sgd(kernel, bias, x, y, passes, average, batch=16):
    """NumPy: SGD on the sum (or mean) of `passes` batch gradients of the MSE, per exchange."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    for start in range(0, len(x), batch * passes):
        summed_kernel, summed_bias = 0.0, 0.0
        for b in range(start, start + batch * passes, batch):
            xb, yb = x[b:b + batch], y[b:b + batch]
            residual = xb @ kernel + bias - yb
            # mean over the batch and the 3 outputs of residual**2
            summed_kernel = summed_kernel + 2 * xb.T @ residual / residual.size
            summed_bias = summed_bias + 2 * residual.sum(axis=0) / residual.size
        scale = LEARNING_RATE / (passes if average else 1)
        kernel, bias = kernel - scale * summed_kernel, bias - scale * summed_bias
    return kernel, bias


@pytest.mark.parametrize("average", [False, True], ids=["sum", "average"])
@pytest.mark.parametrize("compression", [NoCompression(), TopK(1.0)], ids=["none", "topk_all"])
@pytest.mark.parametrize("legacy", [False, True], ids=["optimizer", "legacy"])
def test_passes_are_summed_then_applied_once(compression, average, legacy):
    sgd = keras.optimizers.legacy.SGD if legacy else keras.optimizers.SGD
    optimizer = DistributedOptimizer(sgd(LEARNING_RATE), compression=compression,
                                     backward_passes_per_step=3,
                                     average_aggregated_gradients=average)
    model = linear_model(optimizer)
    kernel, bias = (w.numpy() for w in model.weights)
    x, y = regression_data()
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    expected = reference_sgd(kernel, bias, x, y, passes=3, average=average)
    # float32 against float64, 2 exchanges of sums of 3 x 16 O(1) products: ~1e-6.
    for got, want in zip(model.weights, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert int(optimizer.iterations.numpy()) == 6  # every pass counts, as in Horovod
    assert float(optimizer.compression_stats["steps"].numpy()) == 2  # two exchanges
    assert int(optimizer.gradient_accumulator.counter.numpy()) == 0


def test_checkpoint_between_two_exchanges_resumes_exactly(tmp_path):
    def make():
        return linear_model(DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE),
                                                 compression=TopK(0.3),
                                                 backward_passes_per_step=4))

    x, y = regression_data()  # 6 passes of 16 per epoch: epoch 1 ends mid-accumulation
    continuous = make()
    continuous.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    first = make()
    first.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert int(first.optimizer.gradient_accumulator.counter.numpy()) == 2
    path = tf.train.Checkpoint(model=first, optimizer=first.optimizer).save(str(tmp_path / "c"))
    resumed = make()
    status = tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer).restore(path)
    resumed.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    status.assert_consumed()
    for a, b in zip(continuous.weights, resumed.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    sums = [o.gradient_accumulator.sums for o in (continuous.optimizer, resumed.optimizer)]
    for a, b in zip(*sums):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_accumulator_state_is_not_an_optimizer_variable():
    plain = linear_model(keras.optimizers.SGD(LEARNING_RATE, momentum=0.9))
    wrapped = linear_model(DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE, momentum=0.9),
                                                backward_passes_per_step=2))
    x, y = regression_data(32)
    for model in (plain, wrapped):
        model.fit(x, y, batch_size=16, verbose=0)
    # Horovod's broadcast callback sends optimizer.variables; per-rank sums stay out.
    assert len(wrapped.optimizer.variables) == len(plain.optimizer.variables)


def test_row_sparse_gradients_need_sparse_as_dense_to_accumulate(embedding_model):
    x = np.array([[1, 2, 2], [4, 0, 9]] * 8, np.int32)
    y = np.ones([16, 1], np.float32)
    refused = embedding_model(DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                   backward_passes_per_step=2), vocabulary=10)
    with pytest.raises(ValueError, match=r"gradient of embedding/embeddings:0 is a tf.IndexedSlices; summing it over "
                                         r"backward_passes_per_step > 1 passes needs "
                                         r"sparse_as_dense=True \(as in Horovod\)"):
        refused.fit(x, y, batch_size=8, verbose=0)
    dense = embedding_model(DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                 backward_passes_per_step=2, sparse_as_dense=True),
                            vocabulary=10)
    before = dense.layers[0].embeddings.numpy()
    dense.fit(x, y, batch_size=8, verbose=0)
    changed = np.any(dense.layers[0].embeddings.numpy() != before, axis=1)
    assert changed.tolist() == [i in (0, 1, 2, 4, 9) for i in range(10)]


def test_accumulator_reads_none_where_the_gradient_is_none():
    variables = [tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([1]))]
    accumulator = GradientAccumulator(2, average_aggregated_gradients=True)
    accumulator.build(variables)
    for value in (1.0, 3.0):
        complete = accumulator.add([tf.fill([2], value), None])
    assert bool(complete)
    summed, missing = accumulator.read([variables[0].value(), None])
    assert summed.numpy().tolist() == [2.0, 2.0] and missing is None
    accumulator.reset()
    assert int(accumulator.counter.numpy()) == 0 and accumulator.sums[0].numpy().tolist() == [0, 0]


def test_passes_over_some_of_the_built_variables_sum_into_their_own_sums():
    # Same shapes on purpose: pairing gradients with sums by position would
    # add b's gradient into a's sum without an error.
    a, b = tf.Variable(tf.zeros([2]), name="a"), tf.Variable(tf.zeros([2]), name="b")
    accumulator = GradientAccumulator(2)
    accumulator.build([a, b])
    accumulator.build([b])  # a frozen since
    assert not bool(accumulator.add([tf.constant([1.0, 2.0])], [b]))
    assert bool(accumulator.add([tf.constant([3.0, 4.0])], [b]))
    [summed] = accumulator.read([tf.zeros([2])], [b])
    np.testing.assert_array_equal(summed.numpy(), [4.0, 6.0])
    np.testing.assert_array_equal(accumulator.sum_of(a).numpy(), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"no sum for: \['c:0'\]"):
        accumulator.build([b, tf.Variable(tf.zeros([2]), name="c")])


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("compression", [NoCompression(), TopK(1.0)], ids=["none", "topk_all"])
def test_freezing_a_layer_and_compiling_again_trains_as_plain_keras(compression, passes):
    # Fine-tuning: train, freeze the first layer, compile again with the same
    # optimizer, train on. Failed with "built for a different list of
    # variables" (Horovod's own optimizer fails too with passes > 1). The
    # reference: plain SGD on batches of passes x 16 rows, its learning rate
    # times passes (the summed passes' mean-squared-error gradients).
    x, y = regression_data()

    def train(optimizer, batch_size):
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.layers.Dense(5, activation="relu", input_shape=(4,)),
                                  keras.layers.Dense(3)])
        model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        model.layers[0].trainable = False
        frozen = [w.numpy() for w in model.layers[0].weights]
        model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        for before, after in zip(frozen, model.layers[0].weights):
            np.testing.assert_array_equal(after.numpy(), before)
        return [w.numpy() for w in model.weights]

    ours = train(DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE), compression,
                                      backward_passes_per_step=passes), 16)
    reference = train(keras.optimizers.SGD(LEARNING_RATE * passes), 16 * passes)
    # float32 sums of 16-32 rows in another order: rounding well below 1e-6.
    for a, b in zip(ours, reference):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
