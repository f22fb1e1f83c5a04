"""Tests of the schedule over surviving rows, with a NumPy layer step."""

import numpy as np
import pytest
import scipy.sparse
import tqdm

from tfsparse.graphchallenge._active_rows import run_active_rows


def rule(y, weight, bias):
    """The challenge's rule in float64: Z = Y W; Y = Z + b where Z != 0; clip to [0, 32]."""
    z = y @ weight
    return np.where(z != 0, np.clip(z + bias, 0.0, 32.0), 0.0)


class RecordingStep:
    """A NumPy step (exact float64 arithmetic on small integers) that records its batch sizes."""

    def __init__(self, bias):
        self.bias, self.batches = bias, []

    def __call__(self, y, weight, layer):
        self.batches.append((layer, int(np.shape(y)[0])))
        y = rule(np.asarray(y, np.float64), weight, self.bias)
        return _Tensor(y), _Tensor(y.any(axis=1))


class _Tensor(np.ndarray):
    """An array with ``.numpy()``, as the schedule reads the step's outputs."""

    def __new__(cls, array):
        return np.asarray(array).view(cls)

    def numpy(self):
        return np.asarray(self)


def problem(inputs, seed, fewest_nonzeros=0):
    """Integer weights and inputs (exact in float32 and float64), 8 neurons, 6 layers.

    Row i has ``fewest_nonzeros + i % 5`` nonzero inputs, so rows with fewer
    inputs die earlier (and rows with none are zero from the start).
    """
    rng = np.random.default_rng(seed)
    layers = [np.where(rng.random((8, 8)) < 0.5, rng.integers(1, 3, (8, 8)), 0).astype(float)
              for _ in range(6)]
    features = np.zeros((inputs, 8))
    for row in range(inputs):
        count = fewest_nonzeros + row % 5
        features[row, rng.permutation(8)[:count]] = rng.integers(1, 4, count)
    return features, layers


class Counter:
    """Stands in for the tqdm bar: counts the input-layers reported done."""

    n = 0

    def update(self, count):
        self.n += count


def reference(features, layers, bias):
    """The final activations, and the alive rows entering each layer."""
    y, alive = features, []
    for weight in layers:
        alive.append(y.any(axis=1))
        y = rule(y, weight, bias)
    return y, alive


def run(features, layers, bias, batch_size):
    step, bar = RecordingStep(bias), Counter()
    result = run_active_rows(scipy.sparse.csr_matrix(features),
                             [(weight, index) for index, weight in enumerate(layers)],
                             step, batch_size, bar)
    assert bar.n == features.shape[0] * len(layers)  # every input-layer counted once
    return result, [size for _, size in step.batches], step.batches


@pytest.mark.parametrize("bias, fewest_nonzeros, case", [
    (-1000.0, 0, "all rows die in the first layer"),
    (0.5, 1, "no row dies (positive bias, nonnegative weights)"),
    (-3.0, 0, "rows die at different layers"),
])
@pytest.mark.parametrize("batch_size", [1, 4, 7, 64])
def test_outputs_equal_every_row_through_every_layer(bias, fewest_nonzeros, case, batch_size):
    features, layers = problem(37, seed=2, fewest_nonzeros=fewest_nonzeros)
    expected, _ = reference(features, layers, bias)
    result, sizes, _ = run(features, layers, bias, batch_size)
    assert isinstance(result, scipy.sparse.csr_matrix) and result.shape == (37, 8)
    # Integers below 2^24 and the clip: float32 storage and float64 arithmetic are exact.
    np.testing.assert_array_equal(result.toarray(), expected)
    assert max(sizes) <= batch_size
    if case.startswith("no row"):
        assert expected.any(axis=1).all() and sum(sizes) == 37 * 6
    if case.startswith("all"):
        assert result.nnz == 0 and sum(sizes) == 37
    if case.startswith("rows die"):
        assert 0 < expected.any(axis=1).sum() < 37 and sum(sizes) < 37 * 6


def test_survivors_of_different_batches_are_merged():
    # Batches of 8 thin out and are parked; merged, one call at some layer runs more rows
    # than any single batch still has alive there.
    features, layers = problem(64, seed=2)  # bias -5: batches of 8 thin out at layers 1-3
    expected, alive = reference(features, layers, -5.0)
    result, _, calls = run(features, layers, -5.0, 8)
    np.testing.assert_array_equal(result.toarray(), expected)
    # Entering layer l >= 1, a batch run on its own carries the rows alive after layer l - 1.
    most_per_batch = [alive[layer].reshape(8, 8).sum(axis=1).max() for layer in range(6)]
    assert any(size > most_per_batch[layer] for layer, size in calls if layer > 0)
