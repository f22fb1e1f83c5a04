"""Tests of the MNIST-derived challenge inputs."""

import re

import numpy as np
import pytest
import scipy.sparse

from tfsparse.data import load_mnist_sample
from tfsparse.graphchallenge import mnist_features


def sample_images():
    (x_train, _), (x_test, _) = load_mnist_sample()
    return np.concatenate([x_train, x_test])


def test_identity_size_is_plain_thresholding():
    # 784 = 28 x 28: no resizing, so the features are exactly the thresholded digits.
    features = mnist_features(784, num_inputs=50, threshold=100)
    expected = (sample_images()[:50] > 100).reshape(50, 784)
    np.testing.assert_array_equal(features.toarray(), expected.astype(np.float32))


def bilinear_resize(image, side):
    """Bilinear resize treating pixels as unit squares (centres at i + 0.5), zeros outside."""
    size = image.shape[0]
    coords = (np.arange(side) + 0.5) * size / side - 0.5 + 1  # + 1: the zero padding below
    low = np.floor(coords).astype(int)
    frac = coords - low
    padded = np.pad(image.astype(np.float64), 1)
    rows = padded[low] * (1 - frac)[:, None] + padded[low + 1] * frac[:, None]
    return rows[:, low] * (1 - frac) + rows[:, low + 1] * frac


def test_challenge_size_resizes_and_binarises():
    features = mnist_features(1024, num_inputs=40)
    assert isinstance(features, scipy.sparse.csr_matrix)
    assert features.shape == (40, 1024) and features.dtype == np.float32
    np.testing.assert_array_equal(features.data, 1.0)
    resized = np.stack([bilinear_resize(image, 32) for image in sample_images()[:40]])
    expected = (resized > 32.0).reshape(40, 1024)
    # The library interpolates in float32: only pixels within its rounding of the threshold
    # (relative 1e-6 of values up to 255) may land on the other side.
    differ = features.toarray().astype(bool) != expected
    assert np.all(np.abs(resized.reshape(40, 1024)[differ] - 32.0) < 1e-3)
    assert expected.sum() > 40 * 100  # digits, not empty images


def test_all_inputs_by_default():
    assert mnist_features(64).shape == (5000, 64)


@pytest.mark.parametrize("neurons", [1000, 1, 0, 1024.0])
def test_rejects_non_square_sizes(neurons):
    with pytest.raises(ValueError, match=re.escape(
            f'Received an invalid value for "neurons", expected a perfect square of at least 4 '
            f"(images are sqrt(N) x sqrt(N)). Received: neurons={neurons!r}")):
        mnist_features(neurons)


def test_more_inputs_than_digits_repeat_them_in_order():
    # 12,345 inputs: input i is digit i mod 5000 (the challenge's 60,000 are 12 copies).
    distinct = mnist_features(64)
    tiled = mnist_features(64, num_inputs=12_345)
    assert tiled.shape == (12_345, 64)
    np.testing.assert_array_equal(tiled.toarray(), distinct.toarray()[np.arange(12_345) % 5000])


@pytest.mark.parametrize("num_inputs", [0, -3, 2.0, True])
def test_rejects_bad_num_inputs(num_inputs):
    with pytest.raises(ValueError, match=re.escape(
            f'"num_inputs", expected a positive integer. Received: num_inputs={num_inputs!r}')):
        mnist_features(1024, num_inputs=num_inputs)


@pytest.mark.parametrize("threshold", [float("nan"), "x", None, True])
def test_rejects_a_threshold_that_is_not_a_finite_number(threshold):
    # nan gave all-zero inputs, "x" numpy's TypeError.
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "threshold", expected a finite number (0-255 scale).')):
        mnist_features(64, num_inputs=3, threshold=threshold)
