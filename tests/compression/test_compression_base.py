"""The contract's helpers: selection, target counts, decompression of gathered payloads."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.compression import TopK
from tfsparse.compression.base import select_above
from tfsparse.compression.base import selection_block
from tfsparse.compression.base import target_count


@pytest.mark.parametrize("size", [0, 1, 31, 32, 1000, 100_003])
@pytest.mark.parametrize("block", [1, 16, 32, 64])
@pytest.mark.parametrize("threshold", [0.5, 3.0, 6.0])
def test_select_above_is_numpy_flatnonzero(size, block, threshold):
    magnitudes = np.abs(np.random.default_rng(size).laplace(size=size)).astype(np.float32)
    indices = select_above(tf.constant(magnitudes), threshold, block).numpy()
    expected = np.flatnonzero(magnitudes > threshold)
    if expected.size == 0 and size > 0:
        expected = np.array([np.argmax(magnitudes)])  # at least one element
    np.testing.assert_array_equal(indices, expected)


def test_select_above_sends_nothing_for_zeros():
    assert select_above(tf.zeros([100]), 0.0, 32).numpy().size == 0


def test_selection_block():
    assert selection_block(0.1) == 1
    assert selection_block(0.01) == 1
    assert selection_block(0.002) == 16
    assert selection_block(0.001) == 32
    assert selection_block(0.0001) == 64


@pytest.mark.parametrize("size, ratio, expected", [(0, 0.1, 0), (1, 0.01, 1), (99, 0.01, 1),
                                                   (1000, 0.001, 1), (1000, 0.29, 290), (10, 1.0, 10)])
def test_target_count(size, ratio, expected):
    assert int(target_count(size, ratio)) == expected


def test_decompress_adds_duplicate_indices():
    # The concatenated payloads of several workers decompress to their sum.
    dense = TopK(0.5).decompress(tf.constant([1.0, 2.0, 3.0]), tf.constant([4, 1, 4]), 5)
    np.testing.assert_array_equal(dense.numpy(), [0.0, 2.0, 0.0, 0.0, 4.0])
