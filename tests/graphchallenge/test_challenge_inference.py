"""Tests of the challenge's inference (tfsparse and SciPy) against a dense NumPy reference."""

import re

import numpy as np
import pytest
import scipy.sparse

from tfsparse.graphchallenge import categories
from tfsparse.graphchallenge import count_edges
from tfsparse.graphchallenge import default_bias
from tfsparse.graphchallenge import inference
from tfsparse.graphchallenge import inference_scipy
from tfsparse.graphchallenge import mnist_features
from tfsparse.graphchallenge import prepare_network
from tfsparse.graphchallenge import radixnet


def dense_reference(features, weights, bias):
    """The challenge's rule in float64: Z = Y W; Y = Z + b where Z != 0; clip to [0, 32]."""
    y = np.asarray(features, dtype=np.float64)
    for weight in weights:
        z = y @ weight.toarray().astype(np.float64)
        y = np.where(z != 0, np.clip(z + bias, 0.0, 32.0), 0.0)
    return y


def small_problem(seed=0):
    """64 neurons, 4 connections, 4 layers with weights in [-0.5, 1]; inputs in [0, 16].

    Rows 0 and 1 are zero on input; columns 32..63 are zero, so the first layer
    has structural zeros in Z (where a wrongly added positive bias would show);
    large inputs reach the clip at 32.
    """
    rng = np.random.default_rng(seed)
    weights = radixnet(64, 4, seed=seed, connections=4)
    for weight in weights:
        weight.data = rng.uniform(-0.5, 1.0, weight.nnz).astype(np.float32)
    features = rng.uniform(0, 16, (23, 64)) * (rng.random((23, 64)) < 0.3)
    features[:2] = 0
    features[:, 32:] = 0
    features[2:5] *= 20  # large inputs: clipped at 32
    return scipy.sparse.csr_matrix(features.astype(np.float32)), weights


# Float32 against float64: a layer's rounding error is at most about
# connections * eps32 * sum |w y| <= 4 * 6e-8 * (4 * 1.0 * 32) = 3.1e-5; ReLU and the clip do not
# grow errors and each later layer multiplies them by at most sum |w| <= 4, so after 4 layers the
# error is below 3.1e-5 * (1 + 4 + 16 + 64) = 2.6e-3.
ATOL = 3e-3


@pytest.mark.parametrize("bias", [-0.3, 0.25])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_inference_matches_dense_reference(bias, batch_size):
    features, weights = small_problem()
    expected = dense_reference(features.toarray(), weights, bias)
    assert (expected == 32).any() and (expected == 0).any() and ((expected > 0) & (expected < 32)).any()
    result = inference(features, weights, bias, batch_size=batch_size, progress=False)
    assert isinstance(result, scipy.sparse.csr_matrix) and result.dtype == np.float32
    assert result.shape == (23, 64)
    np.testing.assert_allclose(result.toarray(), expected, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(categories(result), np.flatnonzero(expected.sum(axis=1) != 0))


@pytest.mark.parametrize("bias", [-0.3, 0.25])
def test_scipy_baseline_matches_dense_reference(bias):
    features, weights = small_problem(seed=1)
    expected = dense_reference(features.toarray(), weights, bias)
    result = inference_scipy(features, weights, bias)
    assert isinstance(result, scipy.sparse.csr_matrix) and result.dtype == np.float32
    np.testing.assert_allclose(result.toarray(), expected, rtol=0, atol=ATOL)


def test_prepared_network_gives_the_same_result():
    features, weights = small_problem()
    network = prepare_network(weights)
    assert network.neurons == 64 and len(network.layers) == 4 and network.edges == 4 * 64 * 4
    direct = inference(features, weights, -0.3, progress=False)
    prepared = inference(features, network, -0.3, progress=False)
    assert (direct != prepared).nnz == 0
    with pytest.raises(ValueError, match=re.escape("expected a matrix of 64 columns")):
        inference(features[:, :32], network, -0.3)


def test_bias_goes_to_nonzeros_only():
    # One layer, identity weights: input zeros must stay zero even with a positive bias.
    features = np.array([[0.0, 2.0, 40.0]], np.float32)
    weights = [scipy.sparse.eye(3, format="csr", dtype=np.float32)]
    for result in (inference(features, weights, 0.5, progress=False),
                   inference_scipy(features, weights, 0.5)):
        np.testing.assert_array_equal(result.toarray(), [[0.0, 2.5, 32.0]])


def test_rows_that_die_are_dropped_and_restored_in_place():
    # Rows 0 and 2 die in layer 1, row 1 survives; a batch of 2 loses every row (the early exit).
    weights = [scipy.sparse.eye(4, format="csr", dtype=np.float32)] * 3
    features = np.array([[0.1, 0, 0, 0], [0, 0, 5, 0], [0, 0.2, 0, 0], [0, 0, 0, 0.3]], np.float32)
    expected = dense_reference(features, weights, -0.35)
    for batch_size in (1, 2, 4):
        result = inference(features, weights, -0.35, batch_size=batch_size, progress=False)
        np.testing.assert_allclose(result.toarray(), expected, atol=1e-6)
        np.testing.assert_array_equal(categories(result), [1])


def test_generated_challenge_network_agrees_with_scipy():
    weights = radixnet(1024, 8)
    features = mnist_features(1024, num_inputs=300)
    ours = inference(features, weights, default_bias(1024), progress=False)
    reference = inference_scipy(features, weights, default_bias(1024))
    found = categories(ours)
    np.testing.assert_array_equal(found, categories(reference))
    assert 0 < len(found) < 300  # neither nothing nor everything
    # Values 1/16 * k - 0.3 on the first layer, sums of 32 products later: float32 rounding only.
    np.testing.assert_allclose(ours.toarray(), reference.toarray(), rtol=1e-5, atol=1e-4)


def test_categories_and_edges():
    dense = np.array([[0, 0], [0, 3.0], [1.0, 0]])
    np.testing.assert_array_equal(categories(dense), [1, 2])
    np.testing.assert_array_equal(categories(scipy.sparse.csr_matrix(dense)), [1, 2])
    assert count_edges(radixnet(1024, 120)) == 32 * 1024 * 120


def test_default_bias():
    assert [default_bias(n) for n in (1024, 4096, 16384, 65536)] == [-0.3, -0.35, -0.4, -0.45]
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "neurons", expected one of the challenge\'s sizes '
            "[1024, 4096, 16384, 65536] (pass a bias explicitly for other sizes). Received: neurons=100")):
        default_bias(100)


@pytest.mark.parametrize("function", [inference, inference_scipy])
def test_invalid_arguments(function):
    features, weights = small_problem()
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "weights", expected square sparse matrices of one shape '
            "(64, 64). Received: weights[1] of shape (64, 32)")):
        function(features, [weights[0], weights[1][:, :32]], -0.3)
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "features", expected a matrix of 64 columns (the neurons '
            "of the network). Received: features of shape (23, 32)")):
        function(features[:, :32], weights, -0.3)
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "bias", expected a finite number. Received: bias=nan')):
        function(features, weights, float("nan"))
    with pytest.raises(ValueError, match=re.escape('"weights", expected a non-empty list')):
        function(features, [], -0.3)
    infinite = features.copy()
    infinite.data[3] = np.inf
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "features", expected values finite in float32 '
            "(|value| <= 3.4e38). Received: features holding")):
        function(infinite, weights, -0.3)


@pytest.mark.parametrize("bad", [np.inf, np.nan, 1e39])
def test_weights_not_finite_in_float32_are_refused(bad):
    # The kernels computed 0 * inf = NaN where SciPy's product skips a zero
    # activation: the two disagreed on the categories.
    features, weights = small_problem()
    weights = [w.astype(np.float64) for w in weights]
    weights[1].data[5] = bad
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "weights[1]", expected values finite in float32 '
            "(|value| <= 3.4e38). Received: weights[1] holding")):
        inference(features, weights, -0.3)


def test_invalid_batch_size():
    features, weights = small_problem()
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "batch_size", expected a positive integer or None. '
            "Received: batch_size=0")):
        inference(features, weights, -0.3, batch_size=0)


@pytest.mark.parametrize("bias, survivors", [
    (-0.3, "some"),
    (-100.0, "none"),  # every row dies in the first layer
    (0.5, "all"),  # weights and bias positive: no row with an input dies
])
@pytest.mark.parametrize("batch_size", [16, None])
def test_dropping_rows_on_generated_networks_is_exact(bias, survivors, batch_size):
    # 300 inputs in batches of 16 thin out, are parked and merged across batches.
    weights = radixnet(64, 6, seed=3, connections=8, weight=0.25)
    features = mnist_features(64, num_inputs=300)
    ours = inference(features, weights, bias, batch_size=batch_size, progress=False)
    reference = inference_scipy(features, weights, bias)
    found = categories(ours)
    np.testing.assert_array_equal(found, categories(reference))
    expected_count = {"none": 0, "all": 300}.get(survivors)
    assert len(found) == expected_count if expected_count is not None else 0 < len(found) < 300
    # Sums of 8 products of 0.25 and values up to 32: float32 rounding only (see ATOL).
    np.testing.assert_allclose(ours.toarray(), reference.toarray(), rtol=1e-6, atol=ATOL)
