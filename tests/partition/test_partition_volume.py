"""Exact volume and load of a partition against a brute-force reference."""

import numpy as np
import pytest
import scipy.sparse

from tfsparse.partition import Partition
from tfsparse.partition import communication_volume
from tfsparse.partition.networks import banded_network
from tfsparse.partition.networks import relabel_neurons
from tfsparse.partition.volume import pattern_matrix


def reference_costs(kernels, owners, k):
    """Loops over every nonzero: who needs which input, what each one computes."""
    send = np.zeros((len(kernels), k), dtype=np.int64)
    recv = np.zeros((len(kernels), k), dtype=np.int64)
    load = np.zeros((len(kernels), k), dtype=np.int64)
    for layer, kernel in enumerate(kernels):
        dense = scipy.sparse.coo_matrix(kernel)
        needers = {}
        for i, j in zip(dense.row, dense.col):
            needers.setdefault(int(i), set()).add(int(owners[layer + 1][j]))
            load[layer, owners[layer + 1][j]] += 1
        for i, workers in needers.items():
            owner = int(owners[layer][i])
            for worker in workers - {owner}:
                send[layer, owner] += 1
                recv[layer, worker] += 1
    return send, recv, load


def random_chain(sizes, density, seed):
    rng = np.random.default_rng(seed)
    return [scipy.sparse.random(a, b, density=density, format="csr",
                                random_state=rng, dtype=np.float32)
            for a, b in zip(sizes[:-1], sizes[1:])]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_volume_matches_brute_force(k, seed):
    sizes = [17, 23, 11, 19]
    kernels = random_chain(sizes, 0.2, seed)
    rng = np.random.default_rng(seed + 100)
    owners = [rng.integers(0, k, n) for n in sizes]
    send, recv, load = communication_volume(kernels, owners, k)
    ref_send, ref_recv, ref_load = reference_costs(kernels, owners, k)
    np.testing.assert_array_equal(send, ref_send)
    np.testing.assert_array_equal(recv, ref_recv)
    np.testing.assert_array_equal(load, ref_load)
    # every word sent is received once; the work is every nonzero once
    np.testing.assert_array_equal(send.sum(axis=1), recv.sum(axis=1))
    assert load.sum() == sum(kernel.nnz for kernel in kernels)


def test_explicit_zeros_are_connections_and_arrays_work():
    kernel = scipy.sparse.csr_matrix(
        (np.array([0.0, 1.0]), np.array([1, 0]), np.array([0, 1, 2])),
        shape=(2, 2))
    owners = [np.array([0, 1]), np.array([1, 0])]
    send, recv, _ = communication_volume([kernel], owners, 2)
    # input 0 -> output 1 (owner 0, the input's own owner: free);
    # input 1 -> output 0 (owner 1, the input's owner: free)
    assert send.sum() == 0
    send, _, _ = communication_volume([kernel], [[0, 1], [0, 1]], 2)
    assert send.tolist() == [[1, 1]]
    assert pattern_matrix(np.array([[0.0, 2.0]])).nnz == 1


def test_partition_properties_follow_costs():
    kernels = random_chain([12, 10, 14], 0.3, 3)
    rng = np.random.default_rng(4)
    owners = [rng.integers(0, 3, n) for n in (12, 10, 14)]
    part = Partition.from_owners(kernels, owners, 3)
    send, recv, load = reference_costs(kernels, owners, 3)
    assert part.volume == send.sum()
    assert part.max_volume == send.sum(axis=0).max()
    np.testing.assert_array_equal(part.layer_volume, send.sum(axis=1))
    np.testing.assert_array_equal(part.layer_max_send, send.max(axis=1))
    np.testing.assert_array_equal(part.layer_max_recv, recv.max(axis=1))
    expected = load.max(axis=1) / load.mean(axis=1) - 1
    np.testing.assert_allclose(part.layer_imbalance, expected, rtol=1e-12)
    assert part.imbalance == pytest.approx(expected.max(), rel=1e-12)
    assert part.sizes == [12, 10, 14]
    assert "imbalance" in part.layer_table()


def test_save_and_load_round_trip(tmp_path):
    kernels = banded_network(16, 2, 2)
    owners = [np.arange(16) % 4] * 3
    part = Partition.from_owners(kernels, owners, 4, method="block",
                                 epsilon=0.05, seed=7, seconds=1.5)
    path = tmp_path / "part"  # no suffix: must be written exactly there
    part.save(path)
    loaded = Partition.load(path)
    assert path.exists()
    for a, b in zip(part.owners, loaded.owners):
        np.testing.assert_array_equal(a, b)
    for name in ("send", "recv", "load"):
        np.testing.assert_array_equal(getattr(part, name), getattr(loaded, name))
    assert (loaded.k, loaded.method, loaded.epsilon, loaded.seed,
            loaded.seconds) == (4, "block", 0.05, 7, 1.5)
    assert loaded.volume == part.volume and loaded.imbalance == part.imbalance
    assert repr(loaded) == repr(part)


def test_banded_network_and_relabelling():
    kernels = banded_network(10, 2, 1, seed=3)
    dense = kernels[0].toarray()
    band = np.abs(np.subtract.outer(np.arange(10), np.arange(10))) <= 1
    np.testing.assert_array_equal(dense != 0, band)
    relabelled, perms = relabel_neurons(kernels, seed=5)
    for layer, kernel in enumerate(relabelled):
        expected = kernels[layer].toarray()[perms[layer]][:, perms[layer + 1]]
        np.testing.assert_array_equal(kernel.toarray(), expected)


@pytest.mark.parametrize("owners, message", [
    ([[0, 0, 0], [0, 5]], "expected workers in [0, k=2). Received: owners[1] with entries from "
                          "0 to 5"),
    ([[0, 0, 0], [-1, 0]], "Received: owners[1] with entries from -1 to 0"),
    ([[0, 0, 0], [0, 1, 1]], "expected owners[1] of 2 integers (level 1's neurons). Received: "
                             "owners[1] of shape (3,)"),
    ([[0, 0, 0], [0.7, 1.9]], "Received: owners[1] of shape (2,) and dtype float64"),
    ([[0, 0, 0]], "expected a list of 2 arrays, one per level"),
])
def test_bad_owners_are_clear_errors(owners, message):
    # Before: SciPy's index errors, or an IndexError, or floats truncated.
    kernel = np.ones((3, 2))
    for compute in (lambda: communication_volume([kernel], owners, 2),
                    lambda: Partition.from_owners([kernel], owners, 2)):
        with pytest.raises(ValueError) as error:
            compute()
        assert str(error.value).startswith('Received an invalid value for "owners"')
        assert message in str(error.value)
