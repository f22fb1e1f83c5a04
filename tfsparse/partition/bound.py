"""A lower bound on the volume of every balanced partition of a network.

``volume_lower_bound(weights, k, epsilon)`` returns, per layer, a number of
words that every assignment of the neurons to ``k`` workers whose layers are
all within ``epsilon`` of balance sends at least. It tells how far a
partition can be from the best one, and can prove a volume target out of
reach. The argument, per layer (kernel ``(inputs, outputs)``, output ``u``
with load ``l_u`` = its fan-in, total load ``W``):

1. An input read by outputs on ``lam`` workers costs at least ``lam - 1``
   words, whoever owns it. The layers' bounds add up: the owners shared
   between layers only add constraints.
2. Give every two outputs the demand ``l_u l_v``. Worker loads within
   ``epsilon`` are at most ``c = (1 + epsilon) W / k``, so a partition
   separates a demand of at least ``D = (W^2 - max sum_p L_p^2) / 2``, the
   maximum over loads ``0 <= L_p <= c`` summing to ``W``. Pairs that read no
   common input are taken off ``D``.
3. The demand of two outputs that read ``s`` common inputs is routed in equal
   parts ``l_u l_v / s`` through those inputs. An input whose readers sit on
   ``lam`` workers then separates at most the smaller of its whole routed
   demand and ``(lam - 1) / (2 lam) * d * lambda_max(L + diag(t))`` (``d``
   readers, ``L`` the Laplacian of the demand routed through it, any ``t``
   summing to 0: the eigenvalue bound on a maximum ``lam``-cut, with ``t``
   tuned by subgradient steps).
4. The separated demand reaches ``D``; the fewest words that can carry it,
   taking each input's gains in decreasing order (they shrink as ``lam``
   grows), bound the layer's volume from below.

Each input costs eigenvalue problems of its reader count, so this suits
layers of up to a few thousand neurons. It is strongest where few words can
be saved (near-random layers, such as magnitude-pruned MLPs: Mt-KaHyPar's
partitions of a 90%-sparse MNIST MLP are 1.5x the bound at k = 2 and 2.6x at
k = 16) and exact on dense layers; on layers with locality (a band) it is
near zero, far below what partitions reach.
"""

import numpy as np
import scipy.sparse
from tqdm.auto import tqdm

from tfsparse._validation import check_positive_int
from tfsparse.partition.rows import check_chain
from tfsparse.partition.rows import check_workers
from tfsparse.partition.rows import kernels_of
from tfsparse.partition.volume import pattern_matrix

# Relative margin on every eigenvalue, far above float64 eigensolver error.
_EIGENVALUE_MARGIN = 1e-9


def separated_demand(load, k, epsilon):
    """Least demand ``sum l_u l_v`` over separated pairs, for loads within epsilon.

    Args:
        load: float array of the outputs' loads.
        k: number of workers.
        epsilon: allowed load imbalance.

    Example:
        >>> separated_demand(np.ones(4), 2, 0.0)  # 2 + 2: 4 pairs apart
        4.0
    """
    total = float(np.sum(load))
    capacity = (1.0 + epsilon) * total / k
    full = min(int(total // capacity), k)
    rest = max(total - full * capacity, 0.0)
    return (total * total - full * capacity * capacity - rest * rest) / 2.0


def max_cut_eigenvalue(weights, steps=150):
    """``min_t d * lambda_max(L + diag(t))`` over ``sum(t) = 0``, from above.

    ``L`` is the Laplacian of the symmetric ``weights`` (``d x d``); any ``t``
    gives a valid value, and subgradient steps lower it. A maximum cut of
    the weighted graph is at most a quarter of the result, a maximum
    ``lam``-way cut at most ``(lam - 1) / (2 lam)`` of it.

    Example:
        >>> k4 = np.ones((4, 4)) - np.eye(4)  # its maximum cut is 4
        >>> round(float(max_cut_eigenvalue(k4)) / 4, 6)
        4.0
    """
    weights = np.asarray(weights, dtype=np.float64)
    d = weights.shape[0]
    laplacian = np.diag(weights.sum(axis=1)) - weights
    shift = laplacian.diagonal().mean() - laplacian.diagonal()
    best = np.inf
    step = max(float(np.abs(weights).sum()) / max(d, 1), 1e-300)
    for index in range(steps):
        values, vectors = np.linalg.eigh(laplacian + np.diag(shift))
        best = min(best, d * values[-1])
        direction = vectors[:, -1] ** 2
        direction -= direction.mean()
        norm = np.linalg.norm(direction)
        if norm < 1e-12:
            break
        shift -= step / np.sqrt(index + 1.0) * direction / norm
    return best * (1.0 + _EIGENVALUE_MARGIN) + 1e-12


def layer_volume_lower_bound(kernel, k, epsilon=0.03, steps=150):
    """Least words before one layer over its partitions within ``epsilon``.

    Args:
        kernel: scipy.sparse matrix or array ``(inputs, outputs)``.
        k: number of workers.
        epsilon: allowed load imbalance of the layer.
        steps: subgradient steps per input (more: a higher bound).

    Returns:
        A non-negative int: every assignment of the layer's outputs to ``k``
        workers within ``epsilon`` has at least this volume.

    Example:
        >>> dense = np.ones((5, 6))  # every input read by every output
        >>> int(layer_volume_lower_bound(dense, 2, 0.0))  # each costs 1
        5
    """
    pattern = pattern_matrix(kernel)
    load = np.asarray(pattern.sum(axis=0), dtype=np.float64).ravel()
    if k == 1 or load.sum() == 0:
        return 0
    shared = (pattern.T @ pattern).tocsr()
    shared.setdiag(0)
    shared.eliminate_zeros()
    upper = scipy.sparse.triu(shared, k=1).tocoo()
    all_pairs = (load.sum() ** 2 - np.sum(load ** 2)) / 2.0
    sharing_pairs = float(np.sum(load[upper.row] * load[upper.col]))
    demand = separated_demand(load, k, epsilon) - (all_pairs - sharing_pairs)
    if demand <= 0:
        return 0
    gains = []
    for net in range(pattern.shape[0]):
        pins = pattern.indices[pattern.indptr[net]:pattern.indptr[net + 1]]
        if pins.size < 2:
            continue
        common = shared[pins][:, pins].toarray()
        routed = np.divide(np.outer(load[pins], load[pins]), common,
                           out=np.zeros(common.shape), where=common > 0)
        whole = routed.sum() / 2.0 * (1.0 + _EIGENVALUE_MARGIN)
        eigenvalue = max_cut_eigenvalue(routed, steps)
        separated = [0.0] + [min((lam - 1) / (2.0 * lam) * eigenvalue, whole)
                             for lam in range(2, min(k, pins.size) + 1)]
        gains.extend(np.diff(separated))
    gains = np.sort(np.asarray(gains))[::-1]
    carried = np.cumsum(gains)
    full = int(np.searchsorted(carried, demand))
    if full >= gains.size:  # no partition within epsilon: any bound holds
        return int(gains.size)
    before = carried[full - 1] if full else 0.0
    words = full + (demand - before) / gains[full]
    return int(np.ceil(words - 1e-9))


def volume_lower_bound(weights, k, epsilon=0.03, steps=150, progress=False):
    """Per layer, words that every partition within ``epsilon`` sends at least.

    A certificate: no partition of the network whose layers are all within
    ``epsilon`` (as ``partition_rows(..., "hypergraph")`` returns wherever
    the neurons' work allows) has a ``Partition.layer_volume`` below it, nor
    a volume below its ``sum``. See the module docstring for the argument.

    Args:
        weights: list of ``L`` kernels ``(n_{l-1}, n_l)`` or a SparseDense
            model, as for ``partition_rows``.
        k: number of workers, in ``[1, smallest layer]``.
        epsilon: allowed load imbalance in ``[0, 1)``.
        steps: subgradient steps per input net.
        progress: show a progress bar over the layers.

    Returns:
        int64 array of shape ``(L,)``.

    Raises:
        ValueError: as ``partition_rows`` for bad kernels, ``k`` or
            ``epsilon``, and for ``steps`` below 1.

    Example:
        >>> import scipy.sparse
        >>> w = [scipy.sparse.random(64, 64, 0.2, random_state=0)] * 2
        >>> bound = volume_lower_bound(w, 4)
        >>> from tfsparse.partition import partition_rows
        >>> bool(bound.sum() <= partition_rows(w, 4).volume)
        True
    """
    kernels = kernels_of(weights)
    sizes = check_chain(kernels)
    check_workers(sizes, k, epsilon)
    check_positive_int("steps", steps)
    return np.array([layer_volume_lower_bound(kernel, int(k), epsilon, steps)
                     for kernel in tqdm(kernels, desc="lower bound",
                                        disable=not progress)],
                    dtype=np.int64)
