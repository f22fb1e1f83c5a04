"""partition_rows: consistency, exactness of the models, quality, errors."""

import itertools

import numpy as np
import pytest
import scipy.sparse

from tfsparse.partition import METHODS
from tfsparse.partition import partition_rows
from tfsparse.partition import _hypergraph
from tfsparse.partition import _sweep
from tfsparse.partition._graph import relabel_blocks
from tfsparse.partition._simple import choose_input_owners
from tfsparse.partition.networks import banded_network
from tfsparse.partition.networks import relabel_neurons
from tfsparse.partition.volume import communication_volume
from tfsparse.partition.volume import pattern_matrix
from volume_reference import brute_force_volume


@pytest.fixture(scope="module")
def banded():
    kernels = banded_network(96, 3, 3, seed=0)
    return kernels, relabel_neurons(kernels, seed=1)[0]


@pytest.mark.parametrize("method", METHODS)
def test_owners_cover_every_neuron_and_volume_is_exact(banded, method):
    kernels = banded[1]
    part = partition_rows(kernels, 4, method, seed=0)
    assert [o.size for o in part.owners] == [96, 96, 96, 96]
    for owners in part.owners:
        assert owners.dtype == np.int64
        assert owners.min() >= 0 and owners.max() < 4
    assert part.volume == brute_force_volume(kernels, part.owners)
    assert part.method == method and part.k == 4 and part.seconds >= 0


def test_hypergraph_is_balanced_and_beats_baselines(banded):
    original, relabelled = banded
    for kernels in (original, relabelled):
        parts = {m: partition_rows(kernels, 4, m, epsilon=0.03, seed=0)
                 for m in METHODS}
        assert parts["hypergraph"].imbalance <= 0.03
        for method in ("graph", "block", "random"):
            assert parts["hypergraph"].volume <= parts[method].volume, method
        assert parts["hypergraph"].volume <= 0.5 * parts["random"].volume
    # on the relabelled band, block is as bad as random
    block = partition_rows(relabelled, 4, "block")
    assert block.volume > 3 * partition_rows(relabelled, 4).volume


def test_look_ahead_picks_the_zero_cost_grouping_that_suits_the_next_layer():
    """Layer 1 has 8 disconnected blocks: any grouping costs 0 there.

    Layer 2 reads pairs of blocks {0,1}, {2,3}, ... (renumbered at random):
    only the grouping that puts each pair on one worker makes layer 2 free,
    and only the look-ahead sees it.
    """
    n, blocks = 64, 8
    size = n // blocks
    group = np.arange(n) // size
    first = scipy.sparse.csr_matrix(group[:, None] == group[None, :])
    pair = group // 2
    second = scipy.sparse.csr_matrix(pair[:, None] == pair[None, :])
    kernels, _ = relabel_neurons([first, second], seed=3)
    ahead = partition_rows(kernels, 4, "hypergraph", lookahead=0.5)
    assert ahead.volume == 0
    assert ahead.imbalance <= 0.03


def test_anchors_make_following_layers_free():
    """Permutation layers: exact model (inputs fixed) gives zero volume.

    Without the input owners in the hypergraph, block numbers are arbitrary
    and layers 2.. would each cost about (k - 1) / k of their inputs.
    """
    rng = np.random.default_rng(0)
    n = 64
    # every output reads 4 inputs, so balanced work is balanced counts and
    # the permutation layers can follow their inputs' owners exactly
    cyclic = sum(scipy.sparse.eye(n, k=d, format="csr")
                 + scipy.sparse.eye(n, k=d - n, format="csr")
                 for d in range(4))
    first, _ = relabel_neurons([cyclic], seed=0)
    first = first[0]
    perms = [scipy.sparse.eye(n, format="csr")[rng.permutation(n)]
             for _ in range(3)]
    part = partition_rows([first] + perms, 4, "hypergraph")
    assert part.layer_volume[1:].tolist() == [0, 0, 0]


def test_input_owners_are_needers_so_first_layer_costs_km1():
    kernels = banded_network(40, 1, 2)
    pattern = pattern_matrix(kernels[0])
    rng = np.random.default_rng(2)
    outputs = rng.integers(0, 3, 40)
    inputs = choose_input_owners(pattern, outputs, 3)
    need = (pattern @ scipy.sparse.csr_matrix(
        (np.ones(40), (np.arange(40), outputs)), shape=(40, 3))).toarray() > 0
    assert need[np.arange(40), inputs].all()
    send, _, _ = communication_volume(kernels, [inputs, outputs], 3)
    assert send.sum() == (need.sum(axis=1) - 1).sum()


def test_graph_relabelling_is_the_best_renaming():
    rng = np.random.default_rng(3)
    kernel = scipy.sparse.random(30, 24, density=0.15, random_state=rng)
    pattern = pattern_matrix(kernel)
    inputs = rng.integers(0, 3, 30)
    blocks = rng.integers(0, 3, 24)
    best = min(
        communication_volume([kernel], [inputs, np.array(p)[blocks]], 3)[0].sum()
        for p in itertools.permutations(range(3)))
    chosen = relabel_blocks(pattern, inputs, blocks, 3)
    assert communication_volume([kernel], [inputs, chosen], 3)[0].sum() == best


def test_refinement_never_increases_the_volume(banded):
    kernels = banded[1]
    patterns = [pattern_matrix(k) for k in kernels]
    rng = np.random.default_rng(5)
    owners = [rng.integers(0, 4, 96) for _ in range(4)]
    owners[0] = choose_input_owners(patterns[0], owners[1], 4)
    before = communication_volume(patterns, owners, 4)[0].sum()

    def level(pattern, fixed, layer, next_needs=None):
        return _hypergraph.partition_layer(
            pattern, fixed, 4, 0.03, layer, next_needs=next_needs)

    refined = _sweep.refine(patterns, list(owners), 4, level, 1)
    refined[0] = choose_input_owners(patterns[0], refined[1], 4)
    after = communication_volume(patterns, refined, 4)[0].sum()
    assert after < before


def test_k_one_and_block_random_are_reproducible(banded):
    kernels = banded[0]
    assert partition_rows(kernels, 1).volume == 0
    for method in ("block", "random"):
        a = partition_rows(kernels, 3, method, seed=4)
        b = partition_rows(kernels, 3, method, seed=4)
        for x, y in zip(a.owners, b.owners):
            np.testing.assert_array_equal(x, y)
    block = partition_rows(kernels, 3, "block")
    np.testing.assert_array_equal(block.owners[1], np.arange(96) * 3 // 96)


def test_dense_arrays_and_dead_neurons():
    rng = np.random.default_rng(6)
    first = (rng.random((20, 12)) < 0.3) * 1.0
    first[:, 5] = 0.0  # output 5 reads nothing: no work, still owned
    second = (rng.random((12, 16)) < 0.3) * 1.0
    for method in METHODS:
        part = partition_rows([first, second], 3, method)
        assert part.owners[1].min() >= 0
        assert part.volume == brute_force_volume([first, second], part.owners)


def test_sparse_dense_model_is_accepted():
    from tfsparse._keras import keras
    from tfsparse.layers import SparseDense
    model = keras.Sequential([
        keras.Input((20,)),
        SparseDense(16, density=0.3, seed=1, activation="relu"),
        keras.layers.Dropout(0.1),
        SparseDense(8, density=0.3, seed=2),
    ])
    part = partition_rows(model, 2, "hypergraph")
    kernels = [model.layers[0].to_scipy(), model.layers[2].to_scipy()]
    assert part.sizes == [20, 16, 8]
    assert part.volume == brute_force_volume(kernels, part.owners)
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="Received: layer 'dense"):
        partition_rows(dense, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 17}, 'Received an invalid value for "k", expected an integer in '
                "[1, 16] (the smallest layer has 16 neurons). Received: k=17"),
    ({"k": 0}, "Received: k=0"),
    ({"k": True}, "Received: k=True"),
    ({"k": 2.0}, "Received: k=2.0"),
    ({"k": 2, "epsilon": 1.0},
     'Received an invalid value for "epsilon", expected a float in [0, 1). '
     "Received: epsilon=1.0"),
    ({"k": 2, "epsilon": -0.01}, "Received: epsilon=-0.01"),
    ({"k": 2, "method": "metis"},
     "Received an invalid value for \"method\", expected one of 'hypergraph', "
     "'graph', 'block', 'random'. Received: method='metis'"),
    ({"k": 2, "preset": "fast"}, "Received: preset='fast'"),
    ({"k": 2, "lookahead": 1.5},
     'Received an invalid value for "lookahead", expected a float in [0, 1]. '
     "Received: lookahead=1.5"),
    ({"k": 2, "runs": 0},
     'Received an invalid value for "runs", expected a positive integer. '
     "Received: runs=0"),
    ({"k": 2, "refine": -1},
     'Received an invalid value for "refine", expected a non-negative '
     "integer. Received: refine=-1"),
    ({"k": 2, "method": "random", "seed": -1},
     'Received an invalid value for "seed", expected a non-negative integer. Received: seed=-1'),
    ({"k": 2, "seed": 0.5}, "Received: seed=0.5"),
])
def test_invalid_arguments(kwargs, message):
    kernels = [scipy.sparse.random(20, 16, density=0.2, random_state=0),
               scipy.sparse.random(16, 24, density=0.2, random_state=1)]
    with pytest.raises(ValueError) as error:
        partition_rows(kernels, **kwargs)
    assert message in str(error.value)


def test_invalid_weights():
    a = scipy.sparse.random(16, 48, density=0.1, random_state=0)
    b = scipy.sparse.random(64, 32, density=0.1, random_state=0)
    with pytest.raises(ValueError) as error:
        partition_rows([a, b], 2)
    assert str(error.value) == (
        'Received an invalid value for "weights", expected each kernel\'s '
        "input dimension to equal the previous kernel's output dimension, but "
        "kernel 1 has 64 inputs and kernel 0 has 48 outputs. Received: "
        "shapes=[(16, 48), (64, 32)]")
    with pytest.raises(ValueError, match=r"Received: weights=\[\]"):
        partition_rows([], 2)
    with pytest.raises(ValueError, match=r"Received: kernel 0 of shape \(5,\)"):
        partition_rows([np.ones(5)], 2)


def test_numpy_scalars_are_accepted():
    # np.float32(0.03) was refused as not "a float in [0, 1)".
    kernels = [scipy.sparse.random(20, 16, density=0.2, random_state=0)]
    part = partition_rows(kernels, np.int64(2), "random", epsilon=np.float32(0.03),
                          seed=np.int64(3))
    assert part.k == 2 and part.epsilon == pytest.approx(0.03)


def test_the_deterministic_preset_repeats_its_partition_for_a_seed():
    # The docstring's promise: other presets refine in parallel and may not.
    layers = [scipy.sparse.random(40, 40, density=0.1, format="csr", random_state=i)
              for i in range(3)]
    runs = [partition_rows(layers, 4, preset="deterministic", seed=3) for _ in range(3)]
    for run in runs[1:]:
        assert run.volume == runs[0].volume
        for a, b in zip(run.owners, runs[0].owners):
            np.testing.assert_array_equal(a, b)
