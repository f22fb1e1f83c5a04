"""TopK, DGC, RandomK and NoCompression against NumPy references."""

import numpy as np
import pytest
import tensorflow as tf

from tfsparse.compression import DGC
from tfsparse.compression import NoCompression
from tfsparse.compression import RandomK
from tfsparse.compression import TopK


def normal(size, seed=0):
    return np.random.default_rng(seed).normal(size=size).astype(np.float32)


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.3, 1.0])
def test_topk_is_the_set_of_largest_magnitudes(ratio):
    flat = normal(20_000)
    values, indices = TopK(ratio).compress(tf.constant(flat))
    k = max(1, round(ratio * flat.size))
    expected = np.argsort(-np.abs(flat), kind="stable")[:k]
    np.testing.assert_array_equal(np.sort(indices.numpy()), np.sort(expected))
    np.testing.assert_array_equal(values.numpy(), flat[indices.numpy()])


def test_topk_does_not_send_zeros():
    flat = np.zeros(1000, np.float32)
    flat[[3, 500]] = [2.0, -1.0]
    _, indices = TopK(0.1).compress(tf.constant(flat))
    assert sorted(indices.numpy().tolist()) == [3, 500]


def _is_a_top_set(flat, indices):
    magnitudes = np.abs(flat)
    chosen = np.zeros(flat.size, bool)
    chosen[indices] = True
    return magnitudes[chosen].min() >= magnitudes[~chosen].max()


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.1])
def test_dgc_sends_a_top_set_of_about_k(ratio):
    flat = normal(200_000, seed=1)
    _, indices = DGC(ratio).compress(tf.constant(flat))
    k = round(ratio * flat.size)
    assert 0.8 * k <= indices.shape[0] <= 1.25 * k
    assert _is_a_top_set(flat, indices.numpy())


def test_dgc_falls_back_to_exact_top_k_when_refinement_is_exhausted():
    flat = normal(100_000, seed=2)
    # No refinement and a 1-element sample: the sample's maximum is a poor
    # threshold; too many candidates leave the exact top-k of the candidates.
    compressor = DGC(0.01, sample_ratio=1e-5, max_refinements=0)
    _, indices = compressor.compress(tf.constant(flat))
    assert indices.shape[0] == 1000
    assert _is_a_top_set(flat, indices.numpy())


def test_random_k_is_reproducible_and_changes_every_call():
    flat = tf.constant(normal(50_000, seed=3))
    first, second = RandomK(0.01, seed=7), RandomK(0.01, seed=7)
    a1, a2 = first.compress(flat)[1].numpy(), first.compress(flat)[1].numpy()
    b1 = second.compress(flat)[1].numpy()
    np.testing.assert_array_equal(a1, b1)  # same seed, same call number
    assert len(np.intersect1d(a1, a2)) < 50  # next call: a fresh draw (~5 shared by chance)
    assert 0.97 * 500 <= len(a1) <= 500
    other = RandomK(0.01, seed=8).compress(flat)[1].numpy()
    assert len(np.intersect1d(a1, other)) < 50


def test_random_k_positions_are_uniform():
    flat = tf.constant(normal(10_000, seed=4))
    compressor = RandomK(0.05, seed=0)
    positions = np.concatenate([compressor.compress(flat)[1].numpy() for _ in range(40)])
    counts = np.bincount(positions * 10 // 10_000, minlength=10)
    # 40 draws of 500 positions: 2,000 per tenth, sd ~ 42; 6 sd is 250.
    assert np.all(np.abs(counts - counts.mean()) < 250)


def test_random_k_exact_count_above_the_shuffle_ratio():
    _, indices = RandomK(0.5, seed=1).compress(tf.constant(normal(1001, seed=5)))
    assert indices.shape[0] == 500 and len(np.unique(indices.numpy())) == 500


def test_no_compression_is_the_identity():
    flat = normal(100, seed=6)
    compressor = NoCompression()
    values, indices = compressor.compress(tf.constant(flat))
    np.testing.assert_array_equal(values.numpy(), flat)
    np.testing.assert_array_equal(indices.numpy(), np.arange(100))
    np.testing.assert_array_equal(compressor.decompress(values, indices, 100).numpy(), flat)
    assert compressor.sends_dense and compressor.ratio == 1.0 and compressor.get_config() == {}


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: DGC(0.01, sample_ratio=0), 'Received an invalid value for "sample_ratio", expected a float in (0, 1]. Received: sample_ratio=0'),
        (lambda: DGC(0.01, max_refinements=-1), 'Received an invalid value for "max_refinements", expected a non-negative integer. Received: max_refinements=-1'),
        (lambda: RandomK(0.01, seed=-2), 'Received an invalid value for "seed", expected a non-negative integer. Received: seed=-2'),
        (lambda: RandomK(0.01, seed=1.5), 'Received an invalid value for "seed", expected a non-negative integer. Received: seed=1.5'),
    ],
)
def test_invalid_baseline_arguments(factory, message):
    with pytest.raises(ValueError) as info:
        factory()
    assert str(info.value) == message
