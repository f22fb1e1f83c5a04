"""Test networks with a known locality, and random relabelling of neurons."""

import numpy as np
import scipy.sparse


def banded_network(neurons, layers, window, seed=0):
    """Layers in which neuron ``j`` reads the inputs within ``window`` of ``j``.

    Kernel ``l`` has ``W[i, j] != 0`` exactly when ``|i - j| <= window``
    (not cyclic), with seeded normal values scaled by ``1 / sqrt(fan-in)``.

    Args:
        neurons: neurons per layer.
        layers: number of kernels.
        window: half-width of the band, ``>= 0``.
        seed: seed of the values.

    Returns:
        A list of ``layers`` float32 ``scipy.sparse.csr_matrix`` of shape
        ``(neurons, neurons)``.

    Example:
        >>> banded_network(6, 2, 1)[0].nnz
        16
    """
    rng = np.random.default_rng(seed)
    offsets = list(range(-window, window + 1))
    pattern = scipy.sparse.diags([np.ones(neurons - abs(d)) for d in offsets],
                                 offsets, shape=(neurons, neurons),
                                 format="csr")
    fan_in = np.asarray(pattern.sum(axis=0)).ravel()
    kernels = []
    for _ in range(layers):
        kernel = pattern.copy().astype(np.float32)
        kernel.data = rng.standard_normal(kernel.nnz).astype(np.float32)
        kernel = kernel @ scipy.sparse.diags(1.0 / np.sqrt(fan_in))
        kernels.append(scipy.sparse.csr_matrix(kernel, dtype=np.float32))
    return kernels


def relabel_neurons(kernels, seed=0):
    """Renumbers the neurons of every level (inputs and outputs included) at random.

    Kernel ``l`` becomes ``W_l[p_{l-1}][:, p_l]`` for seeded random
    permutations ``p_0 .. p_L``: the same network (up to the order of its
    inputs and outputs), without the locality its numbering had.

    Args:
        kernels: list of kernels ``(n_{l-1}, n_l)``.
        seed: seed of the permutations.

    Returns:
        ``(relabelled_kernels, permutations)``; neuron ``j`` of the result at
        level ``l`` is neuron ``permutations[l][j]`` of the original.

    Example:
        >>> w, perms = relabel_neurons([scipy.sparse.eye(3, format="csr")])
        >>> w[0].nnz, [sorted(p.tolist()) for p in perms]
        (3, [[0, 1, 2], [0, 1, 2]])
    """
    rng = np.random.default_rng(seed)
    sizes = [kernels[0].shape[0]] + [kernel.shape[1] for kernel in kernels]
    perms = [rng.permutation(n) for n in sizes]
    relabelled = [
        scipy.sparse.csr_matrix(kernel)[perms[l]][:, perms[l + 1]]
        for l, kernel in enumerate(kernels)
    ]
    return relabelled, perms
