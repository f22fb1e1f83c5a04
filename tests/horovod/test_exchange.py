"""CompressedExchange at Horovod size 1: row-sparse gradients, op, sparse_as_dense, statistics.

What 2 ranks compute (allgather, Average against Sum) is checked against NumPy
in tests/multiprocess/test_horovod_compression.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.compression import NoCompression
from tfsparse.compression import SIDCo
from tfsparse.compression import TopK

hvd = pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed")

from tfsparse.horovod import CompressedExchange  # noqa: E402  (needs Horovod)
from tfsparse.horovod.payloads import slices_from_payload  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    assert hvd.size() == 1


def embedding_gradient(rows, seed=0, shape=(8, 3)):
    values = np.random.default_rng(seed).laplace(size=(len(rows), shape[1])).astype(np.float32)
    return tf.IndexedSlices(tf.constant(values), tf.constant(rows, tf.int64),
                            tf.constant(shape, tf.int64)), values


def dense_of(rows, values, shape=(8, 3)):
    dense = np.zeros(shape, np.float32)
    np.add.at(dense, rows, values)
    return dense


@pytest.mark.parametrize("compression", [TopK(0.5), SIDCo(0.3), NoCompression()],
                         ids=["topk", "sidco", "none"])
def test_row_sparse_gradient_stays_row_sparse(compression):
    variable = tf.Variable(tf.zeros([8, 3]))
    rows = [5, 1, 5, 6]
    gradient, values = embedding_gradient(rows)
    exchange = CompressedExchange(compression)
    exchange.build([variable], [gradient])
    (result,) = exchange.exchange([gradient], [variable])
    assert isinstance(result, tf.IndexedSlices)
    assert set(result.indices.numpy().tolist()) <= {1, 5, 6}
    sent = tf.convert_to_tensor(result).numpy()
    residual = 0 if compression.sends_dense else exchange.feedbacks[0].residuals[0].numpy()
    # Size 1: what was sent plus what was kept is the gradient (float32 sums of
    # two O(1) values per element, reordered: within 2 ulps).
    np.testing.assert_allclose(sent + residual, dense_of(rows, values), rtol=2.5e-7, atol=1e-7)
    if not compression.sends_dense:
        assert 0 < np.count_nonzero(sent) < 9  # fewer than the 3 touched rows' 9 elements
        stats = {k: float(v.numpy()) for k, v in exchange.stats.items()}
        assert stats["elements"] == 9  # 3 distinct rows of 3
        assert stats["bytes_sent"] == 8 * stats["selected"]
        assert stats["dense_bytes"] == 4 * 24


def test_sparse_as_dense_densifies_first():
    variable = tf.Variable(tf.zeros([8, 3]))
    gradient, values = embedding_gradient([2, 2, 7])
    exchange = CompressedExchange(TopK(1.0), sparse_as_dense=True)
    exchange.build([variable], [gradient])
    (result,) = exchange.exchange([gradient], [variable])
    assert isinstance(result, tf.Tensor)
    np.testing.assert_array_equal(result.numpy(), dense_of([2, 2, 7], values))


def test_row_sparse_variable_is_kept_out_of_fused_buffers():
    variables = [tf.Variable(tf.zeros([8, 3])), tf.Variable(tf.zeros([4])), tf.Variable(tf.zeros([2]))]
    gradient, _ = embedding_gradient([0, 3])
    dense = [tf.ones([4]), tf.ones([2])]
    exchange = CompressedExchange(TopK(1.0), fused=True)
    exchange.build(variables, [gradient, *dense])
    assert [f.variable_names for f in exchange.feedbacks] == [
        [variables[0].name], [variables[1].name, variables[2].name]]
    result = exchange.exchange([gradient, *dense], variables)
    assert isinstance(result[0], tf.IndexedSlices)
    np.testing.assert_array_equal(result[1].numpy(), np.ones(4))


def test_row_sparse_gradient_into_a_fused_dense_buffer_is_refused():
    variables = [tf.Variable(tf.zeros([8, 3]), name="table"), tf.Variable(tf.zeros([4]))]
    exchange = CompressedExchange(TopK(1.0), fused=True)
    exchange.build(variables)  # built without gradients: both dense, one buffer
    gradient, _ = embedding_gradient([0])
    with pytest.raises(ValueError, match="gradient of table:0 is a tf.IndexedSlices, but the "
                                         "exchange was built with a dense gradient for it"):
        exchange.exchange([gradient, tf.ones([4])], variables)


def test_slices_from_payload_equals_the_dense_scatter_add():
    rng = np.random.default_rng(4)
    indices = rng.integers(0, 30, size=25).astype(np.int32)
    values = rng.normal(size=25).astype(np.float32)
    slices = slices_from_payload(tf.constant(values), tf.constant(indices), [10, 3])
    expected = np.zeros(30, np.float32)
    np.add.at(expected, indices, values)
    # Duplicate positions add in a different order than np.add.at: 2 ulps of O(1) sums.
    np.testing.assert_allclose(tf.convert_to_tensor(slices).numpy().ravel(), expected,
                               rtol=2.5e-7, atol=1e-7)
    assert sorted(slices.indices.numpy().tolist()) == sorted(set((indices // 3).tolist()))


@pytest.mark.parametrize("saved_fused", [False, True])
def test_checkpointed_residuals_restore_into_the_other_buffer_layout(saved_fused, tmp_path):
    # Fused or not, the residuals are one list in the variables' order in
    # the checkpoint; restored into the other layout, each finds its variable
    # (before, only the first buffer's matched: the others restored zeros).
    def exchange_of(fused):
        variables = [tf.Variable(tf.zeros(shape)) for shape in ([6], [3, 2], [5])]
        exchange = CompressedExchange(TopK(0.3), fused=fused)
        exchange.build(variables)
        return exchange, variables

    saved, variables = exchange_of(saved_fused)
    rng = np.random.default_rng(4)
    gradients = [tf.constant(rng.laplace(size=v.shape).astype(np.float32)) for v in variables]
    saved.exchange(gradients, variables)
    want = [saved.residual_of(v).numpy() for v in variables]
    assert all(np.abs(w).sum() > 0 for w in want)  # every residual holds something
    path = tf.train.Checkpoint(exchange=saved).write(str(tmp_path / "exchange"))
    restored, others = exchange_of(not saved_fused)
    tf.train.Checkpoint(exchange=restored).read(path).expect_partial()
    for variable, residual in zip(others, want):
        np.testing.assert_array_equal(restored.residual_of(variable).numpy(), residual)


def test_a_step_over_some_of_the_built_variables_leaves_the_others_residuals():
    # A layer frozen after the first step (compile again with the same
    # optimizer): the exchange takes the other variables alone; the frozen
    # variable's residual waits for it, and the result is the one-variable
    # exchange's.
    a, b = tf.Variable(tf.zeros([4])), tf.Variable(tf.zeros([4]))
    exchange = CompressedExchange(TopK(0.5))
    exchange.build([a, b])
    exchange.exchange([tf.constant([1.0, -4.0, 2.0, 3.0]), tf.constant([5.0, 1.0, 0.5, -6.0])],
                      [a, b])
    residual_a = exchange.residual_of(a).numpy().copy()
    np.testing.assert_array_equal(residual_a, [1.0, 0.0, 2.0, 0.0])
    exchange.build([b])
    [combined] = exchange.exchange([tf.constant([0.0, 2.0, 1.0, 0.0])], [b])
    # b's residual [0, 1, 0.5, 0] plus its gradient: the two largest of [0, 3, 1.5, 0] go.
    np.testing.assert_array_equal(combined.numpy(), [0.0, 3.0, 1.5, 0.0])
    np.testing.assert_array_equal(exchange.residual_of(b).numpy(), [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(exchange.residual_of(a).numpy(), residual_a)


def test_a_step_over_variables_without_residuals_or_part_of_a_fused_buffer_is_refused():
    a, b, c = (tf.Variable(tf.zeros([3]), name=name) for name in "abc")
    exchange = CompressedExchange(TopK(0.5))
    exchange.build([a, b])
    with pytest.raises(ValueError, match=r"has none for: \['c:0'\]"):
        exchange.build([b, c])
    fused = CompressedExchange(TopK(0.5), fused=True)
    fused.build([a, b])
    with pytest.raises(ValueError, match=r"fused=False.*Left out: \['a:0'\]"):
        fused.build([b])
    dense = CompressedExchange(NoCompression())  # no state: any list
    dense.build([a, b])
    dense.build([c])
    [out] = dense.exchange([tf.constant([1.0, 2.0, 3.0])], [c])
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0, 3.0])
