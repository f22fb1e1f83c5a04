"""Heavily pruned layers: constant neurons, inputs nobody reads, tight balance."""

import itertools
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse

from tfsparse.partition import METHODS
from tfsparse.partition import communication_volume
from tfsparse.partition import partition_rows
from tfsparse.partition import _hypergraph
from tfsparse.partition._rebalance import assign_within_limit
from tfsparse.partition._rebalance import km1
from tfsparse.partition._rebalance import rebalance
from tfsparse.partition._simple import place_at_needers
from tfsparse.partition._sweep import place_constants
from tfsparse.partition.volume import pattern_matrix
from volume_reference import brute_force_volume

DATA = pathlib.Path(__file__).parent / "data"
ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def pruned_network(seed=0):
    """Three random layers with dead columns (constants) and dead rows."""
    rng = np.random.default_rng(seed)
    kernels = []
    for inputs, outputs in ((30, 24), (24, 24), (24, 20)):
        kernel = (rng.random((inputs, outputs)) < 0.12) * 1.0
        kernel[:, rng.choice(outputs, 5, replace=False)] = 0.0  # constants
        kernel[rng.choice(inputs, 4, replace=False)] = 0.0  # read by nobody
        kernels.append(kernel)
    return kernels


def test_inputs_nobody_reads_cost_nothing_whoever_owns_them():
    kernel = np.zeros((4, 3))
    kernel[0, :] = 1.0  # input 0 read by all outputs, inputs 1-3 by none
    outputs = np.array([0, 1, 2])
    for inputs in itertools.product(range(3), repeat=4):
        send, recv, _ = communication_volume([kernel], [inputs, outputs], 3)
        # Input 0 is read by workers 0, 1 and 2, so whoever owns it sends
        # it to the two others; inputs 1-3 cost nothing.
        assert send.sum() == recv.sum() == 2
        assert send.sum() == brute_force_volume([kernel], [inputs, outputs])


@pytest.mark.parametrize("method", METHODS)
def test_constant_neurons_sit_with_a_reader(method):
    kernels = pruned_network()
    part = partition_rows(kernels, 3, method)
    assert part.volume == brute_force_volume(kernels, part.owners)
    if method not in ("hypergraph", "graph"):
        return
    for level in (1, 2):  # constants of levels read by a next layer
        constant = ~kernels[level - 1].any(axis=0)
        readers = kernels[level].astype(bool)
        for j in np.flatnonzero(constant & readers.any(axis=1)):
            owners_of_readers = set(part.owners[level + 1][readers[j]])
            assert part.owners[level][j] in owners_of_readers


def test_place_constants_is_exact_and_never_worse():
    kernels = pruned_network(seed=1)
    patterns = [pattern_matrix(k) for k in kernels]
    rng = np.random.default_rng(3)
    for _ in range(5):
        owners = [rng.integers(0, 4, n) for n in (30, 24, 24, 20)]
        before = brute_force_volume(kernels, owners)
        placed = place_constants(patterns, [o.copy() for o in owners], 4)
        after = brute_force_volume(kernels, placed)
        assert after <= before
        # Best possible: each constant moved alone to its best owner.
        best = before
        for level in (1, 2):
            for j in np.flatnonzero(~kernels[level - 1].any(axis=0)):
                costs = []
                for p in range(4):
                    trial = [o.copy() for o in owners]
                    trial[level][j] = p
                    costs.append(brute_force_volume(kernels, trial))
                best -= costs[owners[level][j]] - min(costs)
        assert after == best
        # Loads are untouched: constants have no work.
        np.testing.assert_array_equal(
            communication_volume(kernels, placed, 4)[2],
            communication_volume(kernels, owners, 4)[2])


def test_place_at_needers_keeps_fixed_and_puts_free_on_a_reader():
    pattern = pattern_matrix(np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]]))
    owners = place_at_needers(pattern, [2, -1, -1], [0, 1, 1], 3)
    assert owners[0] == 2 and owners[1] == 1 and 0 <= owners[2] < 3


def test_rebalance_moves_or_swaps_within_the_limit():
    nets = [np.array([0, 1]), np.array([1, 2, 3]), np.array([3, 4])]
    weights = [1, 2, 1]
    # Block 0 holds 6 + 5 = 11 > 10 and no vertex of it fits in block 1
    # (4 + 3 + 2 = 9): only swapping 5 with 4 brings both within 10.
    blocks = np.array([0, 0, 1, 1, 1])
    work = np.array([6, 5, 4, 3, 2])
    repaired, balanced = rebalance(blocks, work, 10, nets, weights, 2)
    assert balanced
    assert np.bincount(repaired, weights=work, minlength=2).max() <= 10
    assert sorted(repaired.tolist()) == [0, 0, 1, 1, 1]
    # The objective of the result, checked by hand-rolled connectivity.
    expected = sum(w * (len({int(repaired[v]) for v in pins}) - 1)
                   for pins, w in zip(nets, weights))
    assert km1(nets, weights, repaired) == expected
    # A plain move when one fits: block 0 over by 1, vertex 2 fits in 1.
    repaired, balanced = rebalance(np.array([0, 0, 0, 1]), np.array([4, 4, 3, 2]),
                                   10, nets[:1], [1], 2)
    assert balanced and repaired.tolist() == [0, 0, 1, 1]
    # Impossible: a single vertex heavier than the limit.
    _, balanced = rebalance(np.array([0, 1]), np.array([11, 1]), 10, nets[:1],
                            [1], 2)
    assert not balanced


def test_rebalance_packs_exactly_when_no_move_or_swap_fits():
    # Block 0 = 5 + 5 + 5 = 15 > 14, block 1 = six 2s = 12: a 5 fits nowhere
    # and no lighter vertex swaps in; only moving a 5 out and two 2s in
    # (14 and 13) meets the limit.
    work = np.array([5, 5, 5, 2, 2, 2, 2, 2, 2])
    blocks = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1])
    nets = [np.array([0, 3]), np.array([1, 2, 4])]
    repaired, balanced = rebalance(blocks, work, 14, nets, [1, 1], 2)
    assert balanced
    assert sorted(np.bincount(repaired, weights=work, minlength=2).tolist()) == [13, 14]


def _brute_force_feasible(work, limit, k):
    return any(np.bincount(np.array(a), weights=work, minlength=k).max() <= limit
               for a in itertools.product(range(k), repeat=work.size))


@pytest.mark.parametrize("seed", range(12))
def test_exact_assignment_is_found_exactly_when_one_exists(seed):
    rng = np.random.default_rng(seed)
    k, m = 3, 7
    work = rng.integers(1, 7, m)
    work[rng.integers(m)] = 0  # a vertex that does not count (an anchor)
    limit = int(np.ceil(work.sum() / k)) + int(rng.integers(0, 2))
    blocks = rng.integers(0, k, m)
    nets = [rng.choice(m, 3, replace=False) for _ in range(4)]
    repaired, balanced = assign_within_limit(blocks, work, limit, nets, [1] * 4, k)
    # Every assignment of the counted vertices enumerated.
    assert balanced == _brute_force_feasible(work[work > 0], limit, k)
    if balanced:
        assert np.bincount(repaired, weights=work, minlength=k).max() <= limit
    else:
        np.testing.assert_array_equal(repaired, blocks)
    # Vertices that do not count never move.
    np.testing.assert_array_equal(repaired[work == 0], blocks[work == 0])


def test_block_pruned_layer_is_packed_within_the_limit(monkeypatch):
    # Block pruning (16 x 16 blocks) leaves 16 neurons reading 64 inputs and
    # 48 reading 48: over 16 workers (limit 214 = floor(1.03 * 208)) every
    # worker must get exactly one 64 and three 48s. Mt-KaHyPar and the greedy
    # repair miss that packing for some seeds (0.15 imbalance seen).
    monkeypatch.setattr(_hypergraph, "_RETRIES", 0)  # repair at once
    for seed in range(6):
        rng = np.random.default_rng(seed)
        kernel = np.zeros((256, 64))
        for j in range(64):
            for b in rng.choice(16, 4 if j < 16 else 3, replace=False):
                kernel[16 * b:16 * b + 16, j] = 1.0
        part = partition_rows([kernel[:, rng.permutation(64)]], 16, "hypergraph")
        assert part.imbalance <= 0.03
        np.testing.assert_array_equal(np.sort(part.load[0]), np.full(16, 208))


def test_tight_pruned_layer_stays_within_the_block_limit(monkeypatch):
    # A layer of a gradually pruned MLP at 1% density (94 working neurons,
    # fan-ins up to 33, 16 workers, limit 42): Mt-KaHyPar returns a block
    # over the limit in more than half of its runs, so without the repair
    # ten balanced runs in a row are very unlikely (< 0.001).
    data = np.load(DATA / "tight_pruned_layer.npz")
    pattern = pattern_matrix(scipy.sparse.csr_matrix(
        (np.ones(data["rows"].size), (data["rows"], data["cols"])),
        shape=tuple(data["shape"])))
    work = np.asarray(pattern.sum(axis=0)).ravel()
    limit = _hypergraph.max_block_weight(work.sum(), 16, 0.03, work.max())
    monkeypatch.setattr(_hypergraph, "_RETRIES", 0)  # repair at once
    for seed in range(10):
        owners = _hypergraph.partition_layer(
            pattern, data["input_owners"].astype(np.int64), 16, 0.03, seed)
        assert np.bincount(owners[owners >= 0], weights=work[owners >= 0],
                           minlength=16).max() <= limit


def test_several_runs_with_the_highest_quality_preset_do_not_crash():
    # Partitioning one Mt-KaHyPar hypergraph with fixed vertices (a second
    # layer's anchors) twice with "highest_quality" at k = 2 is a
    # segmentation fault (Mt-KaHyPar 1.7, this network): every run gets a
    # fresh hypergraph. In a subprocess, so that a crash fails only this test.
    code = (
        "import numpy as np\n"
        "from tfsparse.partition import partition_rows\n"
        "rng = np.random.default_rng(0)\n"
        "kernels = [(rng.random((256, 256)) < 0.1) * 1.0 for _ in range(2)]\n"
        "for k in (2, 4):\n"
        "    part = partition_rows(kernels, k, preset='highest_quality', runs=3)\n"
        "    print(k, part.volume, part.imbalance <= 0.03)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert [line.split()[0] for line in lines if line] == ["2", "4"]
    assert all(line.endswith("True") for line in lines if line)


def test_exact_assignment_takes_the_move_that_lowers_the_objective():
    # Block 0 = 4 + 4 + 4 = 12 > 10; block 1 = 2 + 2 = 4. Moving vertex 0 or
    # vertex 1 fits; vertex 1 shares its two nets with block 1's vertices, so
    # moving it lowers the objective by 2, vertex 0's move would raise it.
    work = np.array([4, 4, 4, 2, 2])
    blocks = np.array([0, 0, 0, 1, 1])
    nets = [np.array([0, 2]), np.array([1, 3]), np.array([1, 4])]
    repaired, balanced = assign_within_limit(blocks, work, 10, nets, [1, 1, 1], 2)
    assert balanced
    assert repaired.tolist() == [0, 1, 0, 1, 1]
    assert km1(nets, [1, 1, 1], repaired) == km1(nets, [1, 1, 1], blocks) - 2
