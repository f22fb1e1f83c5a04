"""A brute-force communication volume, the reference the partition tests check against."""

import scipy.sparse


def brute_force_volume(kernels, owners):
    """Words sent per sample: for every input, the workers that need it but do not own it."""
    total = 0
    for layer, kernel in enumerate(kernels):
        coo = scipy.sparse.coo_matrix(kernel)
        needers = {}
        for i, j in zip(coo.row, coo.col):
            needers.setdefault(int(i), set()).add(int(owners[layer + 1][j]))
        total += sum(len(w - {int(owners[layer][i])})
                     for i, w in needers.items())
    return total
