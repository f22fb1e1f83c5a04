"""One layer's graph model, partitioned by METIS (``pymetis``): the comparison.

The graph matching the column-net hypergraph of ``_hypergraph`` replaces
every net by a clique:

- one vertex per output neuron with a nonempty fan-in, weighted by its fan-in
  size; an edge between two outputs weighted by the number of inputs they
  share (``B^T B`` off its diagonal, ``B`` the 0/1 pattern);
- when the input owners are fixed, ``k`` owner vertices of weight 0, owner
  ``p`` joined to each output by the number of its inputs that ``p`` owns.

METIS minimises the edge cut, which only approximates the volume (a net cut
into ``c`` blocks of sizes ``s_b`` costs ``sum_{b<b'} s_b s_b'`` edges, not
``c - 1`` words), and it cannot fix vertices, so the owner vertices only pull
outputs towards their owners. METIS numbers blocks arbitrarily, so the
blocks are then renamed to the workers that maximise the number of inputs
whose owner is among the workers that need them, which is exact for the
blocks found (a linear assignment).
"""

import numpy as np
import scipy.optimize
import scipy.sparse

from tfsparse.partition.volume import needs_matrix


def _one_hot(labels, k):
    """Rows of ones at ``labels``; a label ``-1`` (free input) gives a zero row."""
    labels = np.asarray(labels)
    rows = np.flatnonzero(labels >= 0)
    return scipy.sparse.csr_matrix(
        (np.ones(rows.size, dtype=np.int64), (rows, labels[rows])),
        shape=(labels.size, k))


def relabel_blocks(pattern, input_owners, output_blocks, k):
    """Renames blocks so that the layer's exact volume is smallest.

    Args:
        pattern: CSR pattern ``(inputs, outputs)``.
        input_owners: int array ``(inputs,)``.
        output_blocks: int array ``(outputs,)`` of block numbers in ``[0, k)``.
        k: number of workers.

    Returns:
        int64 array ``(outputs,)``: the workers, ``mapping[output_blocks]``.
    """
    need = needs_matrix(pattern, output_blocks, k).astype(np.int64)
    # score[p, q]: inputs owned by worker p that block q needs; naming block
    # q after worker p saves exactly score[p, q] words.
    score = _one_hot(input_owners, k).T @ need
    workers, blocks = scipy.optimize.linear_sum_assignment(-np.asarray(score))
    mapping = np.empty(k, dtype=np.int64)
    mapping[blocks] = workers
    return mapping[np.asarray(output_blocks)]


def partition_layer(pattern, input_owners, k, epsilon, seed):
    """Assigns the outputs of one layer to ``k`` workers with METIS.

    Args:
        pattern: CSR pattern ``(inputs, outputs)`` of ones.
        input_owners: int array ``(inputs,)`` or None (first layer); ``-1``
            marks a free input (placed later by the caller), which joins
            no anchor.
        k: number of workers (>= 2).
        epsilon: allowed load imbalance (METIS ``ufactor = 1000 * epsilon``).
        seed: METIS seed.

    Returns:
        int64 array ``(outputs,)`` with -1 for outputs with an empty fan-in.
    """
    try:
        import pymetis
    except ImportError as error:
        raise ImportError(
            'method="graph" needs METIS through the pymetis package: '
            "pip install pymetis") from error

    fan_in = np.asarray(pattern.sum(axis=0)).ravel()
    active = np.flatnonzero(fan_in)
    owners = np.full(pattern.shape[1], -1, dtype=np.int64)
    if active.size == 0:
        return owners
    transposed = pattern[:, active].T.tocsr()
    shared = (transposed @ transposed.T).tolil()
    shared.setdiag(0)
    adjacency = shared.tocsr()
    weights = fan_in[active].astype(np.int64)
    if input_owners is not None:
        owned = transposed @ _one_hot(input_owners, k)
        adjacency = scipy.sparse.bmat([[adjacency, owned], [owned.T, None]])
        weights = np.concatenate([weights, np.zeros(k, dtype=np.int64)])
    adjacency = scipy.sparse.csr_matrix(adjacency)
    adjacency.eliminate_zeros()
    adjacency.sort_indices()
    if adjacency.nnz == 0:  # nothing shared: METIS needs at least one edge
        blocks = np.arange(active.size) % k
    else:
        options = pymetis.Options(seed=int(seed),
                                  ufactor=max(1, int(round(1000 * epsilon))))
        _, blocks = pymetis.part_graph(
            k, pymetis.CSRAdjacency(adjacency.indptr, adjacency.indices),
            vweights=weights, eweights=adjacency.data.astype(np.int64),
            options=options)
        blocks = np.asarray(blocks, dtype=np.int64)[:active.size]
    owners[active] = blocks
    if input_owners is not None:
        owners[active] = relabel_blocks(pattern[:, active], input_owners,
                                        blocks, k)
    return owners
