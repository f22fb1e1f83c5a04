"""Exchange plans: a one-process simulation of every rank equals x @ W."""

import numpy as np
import pytest
import scipy.sparse

from tfsparse.partition import partition_rows
from tfsparse.partition.plan import network_plans
from tfsparse.partition.plan import simulate_forward


def chain(sizes, density, seed):
    rng = np.random.default_rng(seed)
    kernels = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        kernel = scipy.sparse.random(a, b, density=density, format="csr",
                                     random_state=rng, dtype=np.float64)
        kernel.data[:3] = 0.0  # explicit zeros stay connections
        kernels.append(kernel)
    return kernels


@pytest.mark.parametrize("method", ["hypergraph", "random"])
@pytest.mark.parametrize("k", [2, 3])
def test_simulated_ranks_compute_the_network_and_send_the_volume(method, k):
    kernels = chain([30, 24, 28, 20], 0.15, 0)
    part = partition_rows(kernels, k, method)
    x = np.random.default_rng(1).standard_normal((5, 30))
    relu = lambda v: np.maximum(v, 0.0)  # noqa: E731
    y, words = simulate_forward(kernels, part.owners, k, x, relu)
    expected = x
    for kernel in kernels:
        expected = relu(np.asarray(expected @ kernel))
    # float64 sums of at most 30 products in another order: ~1e-15 relative
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(words, part.send)


def test_plans_agree_between_sender_and_receiver_and_keep_every_weight():
    kernels = chain([16, 12, 14], 0.3, 2)
    part = partition_rows(kernels, 3, "random", seed=1)
    plans = [network_plans(kernels, part.owners, r, 3) for r in range(3)]
    for layer, kernel in enumerate(kernels):
        csc = scipy.sparse.csc_matrix(kernel)
        csc.sort_indices()
        seen = np.zeros(csc.nnz, dtype=int)
        for p in range(3):
            plan = plans[p][layer]
            assert plan.send_counts.sum() == part.send[layer, p]
            assert plan.receive_counts.sum() == part.recv[layer, p]
            for q in range(3):
                sent = plan.owned_inputs[plan.send[q]]
                np.testing.assert_array_equal(sent,
                                              plans[q][layer].received[p])
            np.testing.assert_array_equal(plan.kernel.data,
                                          csc.data[plan.positions])
            seen[plan.positions] += 1
        assert (seen == 1).all()  # every weight lives on exactly one rank
        assert sum(plans[p][layer].send_counts.sum() for p in range(3)) == \
            part.layer_volume[layer]
