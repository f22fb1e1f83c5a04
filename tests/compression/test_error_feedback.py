"""ErrorFeedback: residual arithmetic, conservation over steps, non-finite policy, checkpoints."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.compression import ErrorFeedback
from tfsparse.compression import SIDCo
from tfsparse.compression import TopK


def test_residual_is_what_was_not_sent():
    variable = tf.Variable(tf.zeros([6]))
    feedback = ErrorFeedback(TopK(2 / 6), [variable])
    gradient = np.array([0.5, -4.0, 1.0, 3.0, -0.2, 0.1], np.float32)
    values, indices = feedback.compress([tf.constant(gradient)])
    assert sorted(indices.numpy().tolist()) == [1, 3]
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), np.array([0.5, 0, 1.0, 0, -0.2, 0.1], np.float32))
    # Next step: the residual is added before selecting.
    values, indices = feedback.compress([tf.constant([0.6, 0, 0, 0, 0, 0], np.float32)])
    order = np.argsort(indices.numpy())
    assert indices.numpy()[order].tolist() == [0, 2]
    np.testing.assert_allclose(values.numpy()[order], [1.1, 1.0])


def test_nothing_is_lost_over_many_steps():
    # sum of everything sent + final residual == sum of all gradients.
    variables = [tf.Variable(tf.zeros([30, 20])), tf.Variable(tf.zeros([20]))]
    feedback = ErrorFeedback(SIDCo(0.05), variables)
    rng = np.random.default_rng(0)
    total_sent = [np.zeros([30, 20]), np.zeros([20])]
    total_gradient = [np.zeros([30, 20]), np.zeros([20])]
    for _ in range(25):
        grads = [rng.laplace(size=[30, 20]).astype(np.float32), rng.laplace(size=[20]).astype(np.float32)]
        values, indices = feedback.compress([tf.constant(g) for g in grads])
        for i, part in enumerate(feedback.decompress(values, indices)):
            total_sent[i] += part.numpy()
            total_gradient[i] += grads[i]
    for sent, residual, gradient in zip(total_sent, feedback.residuals, total_gradient):
        # float32 additions over 25 steps of O(1) values: error ~ 25 * 6e-8 * 10.
        np.testing.assert_allclose(sent + residual.numpy(), gradient, atol=1e-4)


def test_fused_buffer_indexes_the_concatenation():
    variables = [tf.Variable(tf.zeros([2, 2])), tf.Variable(tf.zeros([3]))]
    feedback = ErrorFeedback(TopK(1 / 7), variables)
    values, indices = feedback.compress([tf.zeros([2, 2]), tf.constant([0.0, 9.0, 0.0])])
    assert indices.numpy().tolist() == [5] and values.numpy().tolist() == [9.0]
    first, second = feedback.decompress(values, indices, scale=0.5)
    assert first.shape == (2, 2) and second.numpy().tolist() == [0.0, 4.5, 0.0]


def test_runs_inside_tf_function():
    variable = tf.Variable(tf.zeros([100]))
    feedback = ErrorFeedback(TopK(0.1), [variable])

    @tf.function
    def step(gradient):
        values, indices = feedback.compress([gradient])
        return feedback.decompress(values, indices)[0]

    gradient = tf.constant(np.random.default_rng(1).normal(size=100).astype(np.float32))
    sent = step(gradient)
    np.testing.assert_array_equal(sent.numpy() + feedback.residuals[0].numpy(), gradient.numpy())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_raises_naming_the_variable(bad):
    variable = tf.Variable(tf.zeros([4]), name="dense_kernel")
    feedback = ErrorFeedback(TopK(0.5), [variable])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Non-finite gradient.*dense_kernel"):
        feedback.compress([tf.constant([1.0, bad, 0.0, 2.0])])


def test_non_finite_gradient_skipped_when_asked():
    variables = [tf.Variable(tf.zeros([4]), name="a"), tf.Variable(tf.zeros([2]), name="b")]
    feedback = ErrorFeedback(TopK(0.5), variables, nonfinite="skip")
    feedback.compress([tf.constant([1.0, 0.0, 0.0, 0.5]), tf.zeros([2])])
    kept = feedback.residuals[0].numpy().copy()
    values, indices = feedback.compress([tf.constant([np.nan, 1.0, 0.0, 0.0]), tf.constant([3.0, -7.0])])
    # Variable a sends nothing and keeps its residual; b is compressed as usual.
    assert not np.any(np.isnan(values.numpy()))
    assert all(i >= 4 for i in indices.numpy().tolist())
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), kept)


HUGE = np.float32(3e38)  # twice it overflows float32 (largest 3.4e38) to Inf


def test_a_gradient_overflowing_with_its_residual_raises():
    variable = tf.Variable(tf.zeros([4]), name="dense_kernel")
    feedback = ErrorFeedback(TopK(0.25), [variable])
    feedback.residuals[0].assign([HUGE, 0.0, 0.0, 0.0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="dense_kernel:0, or its sum with the error-feedback residual overflowed"):
        feedback.compress([tf.constant([HUGE, 1.0, 0.0, 0.0])])


def test_a_gradient_overflowing_with_its_residual_is_skipped_when_asked():
    variables = [tf.Variable(tf.zeros([4]), name="a"), tf.Variable(tf.zeros([2]), name="b")]
    feedback = ErrorFeedback(TopK(0.5), variables, nonfinite="skip")
    feedback.residuals[0].assign([HUGE, 0.0, 0.5, 0.0])
    values, indices = feedback.compress([tf.constant([HUGE, 1.0, 0.0, 0.0]),
                                         tf.constant([3.0, -7.0])])
    # a sends nothing and keeps its residual (no Inf sent, no NaN kept); b as usual.
    assert np.all(np.isfinite(values.numpy()))
    assert all(i >= 4 for i in indices.numpy().tolist())
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), [HUGE, 0.0, 0.5, 0.0])
    # A later finite step is compressed as usual, the residual included.
    values, indices = feedback.compress([tf.constant([-HUGE, 0.0, 0.0, 0.0]), tf.zeros([2])])
    sent = feedback.decompress(values, indices)[0].numpy() + feedback.residuals[0].numpy()
    np.testing.assert_array_equal(sent, [0.0, 0.0, 0.5, 0.0])


def test_a_row_summed_with_its_duplicate_and_residual_is_checked():
    variable = tf.Variable(tf.zeros([4, 2]), name="embedding")
    feedback = ErrorFeedback(TopK(0.5), [variable], nonfinite="skip")
    feedback.residuals[0].assign(np.ones([4, 2], np.float32))
    # Row 2 twice: each finite, their sum Inf.
    values, _ = feedback.compress_slices(_slices([[HUGE, 1.0], [HUGE, 1.0]], [2, 2], [4, 2]))
    assert np.all(values.numpy() == 0.0)
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), np.ones([4, 2]))
    raising = ErrorFeedback(TopK(0.5), [variable])
    raising.residuals[0].assign(np.full([4, 2], HUGE))
    with pytest.raises(tf.errors.InvalidArgumentError, match="embedding:0, or its sum"):
        raising.compress_slices(_slices([[HUGE, 1.0]], [1], [4, 2]))


def test_residuals_are_saved_and_restored_with_checkpoints(tmp_path):
    variable = tf.Variable(tf.zeros([50]))
    feedback = ErrorFeedback(SIDCo(0.1), [variable])
    feedback.compress([tf.constant(np.random.default_rng(2).normal(size=50).astype(np.float32))])
    path = tf.train.Checkpoint(feedback=feedback).save(str(tmp_path / "feedback"))
    restored = ErrorFeedback(SIDCo(0.1), [tf.Variable(tf.zeros([50]))])
    tf.train.Checkpoint(feedback=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored.residuals[0].numpy(), feedback.residuals[0].numpy())
    assert np.any(restored.residuals[0].numpy() != 0)
    assert not restored.residuals[0].trainable


def test_invalid_arguments():
    with pytest.raises(ValueError, match='"nonfinite", expected one of \'raise\', \'skip\'. Received: nonfinite=\'ignore\''):
        ErrorFeedback(TopK(0.1), [tf.Variable(tf.zeros([2]))], nonfinite="ignore")
    with pytest.raises(ValueError, match="single dtype"):
        ErrorFeedback(TopK(0.1), [tf.Variable(tf.zeros([2])), tf.Variable(tf.zeros([2], tf.float64))])
    with pytest.raises(ValueError, match="at least one variable"):
        ErrorFeedback(TopK(0.1), [])


def _slices(values, rows, shape):
    return tf.IndexedSlices(tf.constant(values, tf.float32), tf.constant(rows, tf.int64),
                            tf.constant(shape, tf.int64))


def test_row_sparse_gradient_selects_among_its_rows_with_their_residual():
    variable = tf.Variable(tf.zeros([5, 2]))
    feedback = ErrorFeedback(TopK(0.5), [variable])
    residual = np.arange(10, dtype=np.float32).reshape(5, 2) / 10
    feedback.residuals[0].assign(residual)
    # Row 3 appears twice (summed), rows 0, 2, 4 are not touched.
    gradient = np.array([[1.0, -4.0], [0.5, 0.5], [2.0, 0.0]], np.float32)
    values, indices = feedback.compress_slices(_slices(gradient, [3, 1, 3], [5, 2]))
    # NumPy reference: candidates are rows 3 and 1, summed, plus their residual rows.
    candidates = {3: gradient[0] + gradient[2] + residual[3], 1: gradient[1] + residual[1]}
    flat = {row * 2 + col: candidates[row][col] for row in candidates for col in range(2)}
    top = sorted(flat, key=lambda p: -abs(flat[p]))[:2]  # TopK(0.5) of 4 candidates
    order = np.argsort(indices.numpy())
    assert indices.numpy()[order].tolist() == sorted(top)
    np.testing.assert_array_equal(values.numpy()[order], [flat[p] for p in sorted(top)])
    expected = residual.copy()
    for position, value in flat.items():
        expected.flat[position] = 0.0 if position in top else value
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), expected)


def test_row_sparse_gradients_lose_nothing_over_many_steps():
    variable = tf.Variable(tf.zeros([40, 3]))
    feedback = ErrorFeedback(SIDCo(0.1), [variable])
    rng = np.random.default_rng(3)
    sent, total = np.zeros([40, 3]), np.zeros([40, 3])
    for _ in range(20):
        rows = rng.integers(0, 40, size=12)
        gradient = rng.laplace(size=[12, 3]).astype(np.float32)
        np.add.at(total, rows, gradient)
        values, indices = feedback.compress_slices(_slices(gradient, rows, [40, 3]))
        sent += feedback.decompress(values, indices)[0].numpy()
    # float32 sums of O(1) values over 20 steps: error ~ 20 * 6e-8 * 10.
    np.testing.assert_allclose(sent + feedback.residuals[0].numpy(), total, atol=1e-4)


def test_non_finite_row_sparse_gradient_skipped_when_asked():
    variable = tf.Variable(tf.zeros([4, 2]), name="embedding")
    feedback = ErrorFeedback(TopK(0.5), [variable], nonfinite="skip")
    feedback.residuals[0].assign(np.ones([4, 2], np.float32))
    values, _ = feedback.compress_slices(_slices([[np.nan, 1.0]], [2], [4, 2]))
    assert values.numpy().tolist() in ([], [0.0])  # nothing but zeros is sent
    np.testing.assert_array_equal(feedback.residuals[0].numpy(), np.ones([4, 2]))
    raising = ErrorFeedback(TopK(0.5), [variable])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Non-finite gradient.*embedding"):
        raising.compress_slices(_slices([[np.inf, 1.0]], [2], [4, 2]))


def test_row_sparse_gradient_needs_a_single_variable():
    feedback = ErrorFeedback(TopK(0.5), [tf.Variable(tf.zeros([2, 2])), tf.Variable(tf.zeros([2]))])
    with pytest.raises(ValueError, match="single variable; this ErrorFeedback holds 2 variables"):
        feedback.compress_slices(_slices([[1.0, 2.0]], [0], [2, 2]))
