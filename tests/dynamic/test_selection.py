import numpy as np
import pytest

from tfsparse.dynamic import selection


def _reference_top(scores, keys, k):
    """Largest scores first, then smaller keys: a full lexicographic sort."""
    return set(np.lexsort((keys, -scores))[:k].tolist())


@pytest.mark.parametrize("seed", range(5))
def test_top_k_breaks_ties_by_key_as_a_full_sort(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, 50).astype(float)  # many ties
    keys = rng.permutation(1000)[:50]
    for k in (0, 1, 7, 25, 50, 60):
        assert set(selection.top_k(scores, k, keys=keys).tolist()) == _reference_top(
            scores, keys, min(k, 50))


def test_running_top_k_over_blocks_equals_one_top_k():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 103).astype(np.float32)
    best = selection.RunningTopK(17)
    for start in range(0, 103, 10):
        best.add(scores[start:start + 10], offset=start)
    expected = sorted(_reference_top(scores, np.arange(103), 17))
    assert best.keys().tolist() == expected


def test_kept_after_drop_drops_smallest_magnitudes_smaller_key_first():
    values = np.array([0.5, -0.2, 0.2, 0.2, -3.0, 0.0])
    # |v| ascending: 0.0 (5), then 0.2 at keys 1, 2, 3: the drop of 3 takes 5, 1, 2.
    assert selection.kept_after_drop(values, 3).tolist() == [0, 3, 4]


@pytest.mark.parametrize("zeros", [0.0, 0.6], ids=["distinct", "many-ties"])
@pytest.mark.parametrize("n_drop", [0, 1, 30_000, 199_999, 200_000])
def test_split_by_magnitude_equals_a_full_sort(zeros, n_drop):
    # Over 65,536 values the drop filters with a sampled bound: the split must
    # still be the full stable sort's (smallest magnitudes, smaller index first).
    rng = np.random.default_rng(n_drop)
    values = rng.standard_normal(200_000).astype(np.float32)
    values[rng.random(values.size) < zeros] = 0
    order = np.argsort(np.abs(values), kind="stable")
    kept, dropped = selection.split_by_magnitude(values, n_drop)
    assert dropped.tolist() == np.sort(order[:n_drop]).tolist()
    assert kept.tolist() == np.sort(order[n_drop:]).tolist()


def test_kept_after_drop_rejects_non_finite_values():
    with pytest.raises(ValueError, match="non-finite"):
        selection.kept_after_drop([1.0, np.nan], 1)


@pytest.mark.parametrize("total", [200, (1 << 22) + 5000], ids=["choice", "rejection"])
def test_random_free_keys_are_distinct_free_and_uniform(total):
    rng = np.random.default_rng(0)
    taken = np.sort(rng.choice(total, 100, replace=False))
    counts = np.zeros(8)
    for _ in range(200):
        keys = selection.random_free_keys(rng, total, 50, taken)
        assert keys.size == 50 and np.unique(keys).size == 50
        assert not np.isin(keys, taken).any() and keys.min() >= 0 and keys.max() < total
        counts += np.bincount(keys * 8 // total, minlength=8)
    # 10,000 draws over 8 ranges: each count is binomial with p = the range's
    # share of the free keys, std <= 50; 5 std fails a biased draw, not chance.
    free = np.setdiff1d(np.arange(total), taken) if total < 1000 else None
    share = (np.bincount(free * 8 // total, minlength=8) / free.size if free is not None
             else np.full(8, 1 / 8))
    assert np.all(np.abs(counts - 10000 * share) < 250), (counts, 10000 * share)


def test_random_free_keys_refuses_more_than_free():
    with pytest.raises(ValueError, match="only 2 are free"):
        selection.random_free_keys(np.random.default_rng(0), 5, 3, np.array([0, 1, 2]))


def test_new_order_maps_kept_keys_and_marks_new_ones():
    assert selection.new_order(np.array([2, 4, 9]), np.array([0, 4, 9, 12])).tolist() == [
        -1, 1, 2, -1]


@pytest.mark.parametrize("seed", range(3))
def test_merge_kept_and_grown_equals_sorting_and_new_order(seed):
    rng = np.random.default_rng(seed)
    old_keys = np.sort(rng.choice(5000, 800, replace=False))
    dropping = rng.random(800) < 0.3
    kept, dropped = np.flatnonzero(~dropping), np.flatnonzero(dropping)
    free = np.setdiff1d(np.arange(5000), old_keys[kept])
    # Half regrow just-dropped positions (they keep their index), half are new.
    grown = np.sort(np.concatenate([
        rng.choice(old_keys[dropped], dropped.size // 2, replace=False),
        rng.choice(np.setdiff1d(free, old_keys), dropped.size - dropped.size // 2,
                   replace=False)]))
    keys, source = selection.merge_kept_and_grown(old_keys, kept, dropped, grown)
    expected = np.sort(np.concatenate([old_keys[kept], grown]))
    assert keys.tolist() == expected.tolist()
    assert source.tolist() == selection.new_order(old_keys, expected).tolist()


@pytest.mark.parametrize("zeros", [0.0, 0.6, 1.0], ids=["distinct", "many-ties", "all-tied"])
@pytest.mark.parametrize("k", [1, 3000, 40000])
def test_top_k_of_large_arrays_is_exact_with_ties(zeros, k):
    # Over 65,536 scores top_k filters with a sampled bound first: the result
    # must still be exactly the full sort's, ties at zero included.
    rng = np.random.default_rng(k)
    scores = np.abs(rng.standard_normal(300_000)).astype(np.float32)
    scores[rng.random(scores.size) < zeros] = 0
    scores[:50] = -np.inf
    expected = _reference_top(scores, np.arange(scores.size), k)
    assert set(selection.top_k(scores, k).tolist()) == expected
    best = selection.RunningTopK(k)
    for start in range(0, scores.size, 70_000):
        best.add(scores[start:start + 70_000], offset=start)
    assert best.keys().tolist() == sorted(expected)
