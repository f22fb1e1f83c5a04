"""volume_lower_bound: never above the best balanced partition, found by brute force."""

import itertools

import numpy as np
import pytest
import scipy.sparse

from tfsparse.partition import partition_rows
from tfsparse.partition import volume_lower_bound
from tfsparse.partition.bound import layer_volume_lower_bound
from tfsparse.partition.bound import max_cut_eigenvalue
from tfsparse.partition.bound import separated_demand
from volume_reference import brute_force_volume


def random_layer(rng, inputs, outputs, density):
    mask = rng.random((inputs, outputs)) < density
    return scipy.sparse.csr_matrix(mask * rng.normal(size=mask.shape))


def balanced(kernel, owners, k, epsilon):
    load = np.bincount(owners, weights=np.asarray(
        (scipy.sparse.csr_matrix(kernel) != 0).sum(axis=0)).ravel(),
        minlength=k)
    return load.max() <= (1 + epsilon) * load.sum() / k + 1e-9


def best_balanced_volume(kernels, k, epsilon):
    """Least volume over every assignment of the outputs whose layers are within epsilon.

    The network's inputs go to a worker reading them (or worker 0), which is
    the cheapest owner; every other level is enumerated.
    """
    sizes = [kernel.shape[1] for kernel in kernels]
    best = None
    for flat in itertools.product(range(k), repeat=sum(sizes)):
        levels = np.split(np.array(flat), np.cumsum(sizes)[:-1])
        if not all(balanced(kernel, owners, k, epsilon)
                   for kernel, owners in zip(kernels, levels)):
            continue
        first = scipy.sparse.csr_matrix(kernels[0])
        inputs = np.array([levels[0][first.indices[first.indptr[i]]]
                           if first.indptr[i + 1] > first.indptr[i] else 0
                           for i in range(first.shape[0])])
        volume = brute_force_volume(kernels, [inputs] + levels)
        best = volume if best is None else min(best, volume)
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k,epsilon", [(2, 0.05), (2, 0.2), (3, 0.25), (3, 0.5)])
def test_bound_never_exceeds_the_best_balanced_layer(seed, k, epsilon):
    rng = np.random.default_rng(seed)
    kernel = random_layer(rng, 7, 8 if k == 2 else 7, 0.45)
    best = best_balanced_volume([kernel], k, epsilon)
    assert best is not None, "the case should admit a balanced assignment"
    assert 0 <= layer_volume_lower_bound(kernel, k, epsilon) <= best


@pytest.mark.parametrize("seed", range(4))
def test_bound_of_a_chain_never_exceeds_the_best_balanced_chain(seed):
    rng = np.random.default_rng(100 + seed)
    kernels = [random_layer(rng, 6, 6, 0.5), random_layer(rng, 6, 6, 0.5)]
    best = best_balanced_volume(kernels, 2, 0.1)
    bound = volume_lower_bound(kernels, 2, 0.1)
    assert bound.shape == (2,) and bound.dtype == np.int64
    assert bound.sum() <= best


@pytest.mark.parametrize("k", [2, 3])
def test_bound_is_tight_on_dense_layers(k):
    # Every input of a dense layer is read on all k workers: (k - 1) words.
    inputs, outputs = 5, 6
    assert layer_volume_lower_bound(np.ones((inputs, outputs)), k, 0.0) \
        == inputs * (k - 1)


def test_bound_is_positive_on_random_sparse_layers_and_zero_with_one_worker():
    rng = np.random.default_rng(7)
    kernel = random_layer(rng, 64, 64, 0.3)
    assert layer_volume_lower_bound(kernel, 2, 0.03) > 0.4 * 64
    assert layer_volume_lower_bound(kernel, 1, 0.03) == 0
    assert layer_volume_lower_bound(scipy.sparse.csr_matrix((4, 4)), 2) == 0


def test_bound_of_disconnected_blocks_is_zero():
    # Two independent halves fit two workers without any word sent.
    block = scipy.sparse.block_diag([np.ones((4, 4)), np.ones((4, 4))])
    assert volume_lower_bound([block, block], 2, 0.0).tolist() == [0, 0]


@pytest.mark.parametrize("method", ["hypergraph", "random", "block"])
@pytest.mark.parametrize("k", [2, 4])
def test_bound_is_below_every_balanced_partition_per_layer(method, k):
    rng = np.random.default_rng(3)
    kernels = [random_layer(rng, 96, 96, 0.1) for _ in range(3)]
    bound = volume_lower_bound(kernels, k, 0.03)
    part = partition_rows(kernels, k, method, epsilon=0.03)
    for layer in range(3):
        if part.layer_imbalance[layer] <= 0.03 + 1e-12:
            assert bound[layer] <= part.layer_volume[layer]
    assert method != "hypergraph" or bound.sum() <= part.volume


@pytest.mark.parametrize("seed", range(5))
def test_max_cut_eigenvalue_bounds_the_two_and_three_way_cuts(seed):
    rng = np.random.default_rng(seed)
    weights = np.triu(rng.random((7, 7)) * (rng.random((7, 7)) < 0.7), 1)
    weights += weights.T
    value = max_cut_eigenvalue(weights)
    for lam in (2, 3):
        best = max(
            sum(weights[a, b] for a in range(7) for b in range(a + 1, 7)
                if labels[a] != labels[b])
            for labels in itertools.product(range(lam), repeat=7))
        assert best <= (lam - 1) / (2 * lam) * value + 1e-9
    # Any shift summing to zero is valid: no shift gives d * lambda_max(L).
    laplacian = np.diag(weights.sum(axis=1)) - weights
    assert value <= 7 * np.linalg.eigvalsh(laplacian)[-1] * (1 + 1e-8)


def test_separated_demand_is_the_least_over_balanced_loads():
    load = np.array([3.0, 1.0, 1.0, 1.0, 2.0])
    for k, epsilon in [(2, 0.0), (2, 0.25), (3, 0.2)]:
        capacity = (1 + epsilon) * load.sum() / k
        least = min(
            sum(load[a] * load[b] for a in range(5) for b in range(a + 1, 5)
                if labels[a] != labels[b])
            for labels in itertools.product(range(k), repeat=5)
            if np.bincount(labels, weights=load, minlength=k).max()
            <= capacity + 1e-9)
        assert separated_demand(load, k, epsilon) <= least + 1e-9


def test_sparse_dense_model_is_accepted():
    from tfsparse._keras import keras
    from tfsparse.layers import SparseDense

    model = keras.Sequential([keras.Input((32,)),
                              SparseDense(32, density=0.3, seed=0),
                              SparseDense(32, density=0.3, seed=1)])
    kernels = [layer.to_scipy() for layer in model.layers]
    assert volume_lower_bound(model, 2).tolist() \
        == volume_lower_bound(kernels, 2).tolist()


@pytest.mark.parametrize("kwargs,message", [
    ({"k": 9}, r'"k", expected an integer in \[1, 8\].*k=9'),
    ({"k": 2, "epsilon": 1.0}, r'"epsilon".*epsilon=1.0'),
    ({"k": 2, "steps": 0}, r'"steps", expected a positive integer.*steps=0'),
])
def test_invalid_arguments(kwargs, message):
    kernels = [scipy.sparse.eye(8, format="csr")] * 2
    with pytest.raises(ValueError, match=message):
        volume_lower_bound(kernels, **kwargs)


def test_kernels_that_do_not_chain():
    with pytest.raises(ValueError, match="kernel 1 has 5 inputs"):
        volume_lower_bound([np.ones((4, 4)), np.ones((5, 4))], 2)
