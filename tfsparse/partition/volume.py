"""Exact communication volume and load of a neuron partition (plain NumPy/SciPy).

The network is a chain of sparse kernels in the Keras orientation: kernel ``l``
has shape ``(n_{l-1}, n_l)`` and layer ``l`` computes ``y = x @ W_l``. Output
neuron ``j`` of layer ``l`` reads the inputs ``i`` with ``W_l[i, j] != 0`` (its
fan-in, column ``j``). ``owners[l][j]`` is the worker that owns neuron ``j`` of
layer ``l`` (``owners[0]`` owns the network's inputs): it computes that neuron
and holds its fan-in weights.

Before layer ``l`` the owner of input ``i`` sends its value to every other
worker that owns an output reading it, so per sample layer ``l`` moves

    sum_i |{owners[l][j] : W_l[i, j] != 0} - {owners[l-1][i]}|

words. The backward pass moves the same number of words the other way (each
of those workers returns one partial input gradient), so a training step moves
twice this.
"""

import numpy as np
import scipy.sparse

from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value


def pattern_matrix(kernel):
    """Returns the structural pattern of a kernel as a CSR matrix of ones.

    Every stored entry counts as a connection, explicit zeros included: a
    sparse layer computes over its whole pattern whatever the values are.

    Args:
        kernel: a scipy.sparse matrix or a 2-D NumPy array of shape
            ``(inputs, outputs)``; for an array its nonzeros are the pattern.

    Returns:
        ``scipy.sparse.csr_matrix`` of int32 ones with the kernel's shape.

    Example:
        >>> pattern_matrix(np.array([[0.0, 2.0], [3.0, 0.0]])).toarray()
        array([[0, 1],
               [1, 0]], dtype=int32)
    """
    if scipy.sparse.issparse(kernel):
        matrix = scipy.sparse.csr_matrix(kernel, copy=True)
        matrix.sum_duplicates()
    else:
        matrix = scipy.sparse.csr_matrix(np.asarray(kernel) != 0)
    matrix.data = np.ones(matrix.nnz, dtype=np.int32)
    matrix.indices = matrix.indices.astype(np.int32, copy=False)
    return matrix


def needs_matrix(pattern, output_owners, k):
    """Returns which workers need each input of one layer.

    Args:
        pattern: CSR pattern ``(inputs, outputs)`` from ``pattern_matrix``.
        output_owners: int array ``(outputs,)`` of workers in ``[0, k)``.
        k: number of workers.

    Returns:
        Boolean array ``(inputs, k)``: entry ``[i, p]`` is True when worker
        ``p`` owns an output whose fan-in contains input ``i``.
    """
    n_outputs = pattern.shape[1]
    assign = scipy.sparse.csr_matrix(
        (np.ones(n_outputs, dtype=np.int32),
         (np.arange(n_outputs), np.asarray(output_owners))),
        shape=(n_outputs, k))
    return (pattern @ assign).toarray() > 0


def layer_traffic(pattern, input_owners, output_owners, k):
    """Words each worker sends and receives per sample before one layer.

    Args:
        pattern: CSR pattern ``(inputs, outputs)``.
        input_owners: int array ``(inputs,)``.
        output_owners: int array ``(outputs,)``.
        k: number of workers.

    Returns:
        ``(send, recv)``, two int64 arrays of shape ``(k,)``.
    """
    need = needs_matrix(pattern, output_owners, k)
    input_owners = np.asarray(input_owners)
    need[np.arange(need.shape[0]), input_owners] = False
    send = np.bincount(input_owners, weights=need.sum(axis=1), minlength=k)
    recv = need.sum(axis=0)
    return send.astype(np.int64), recv.astype(np.int64)


def layer_load(pattern, output_owners, k):
    """Multiply-adds each worker does per sample in one layer (its nonzeros).

    Args:
        pattern: CSR pattern ``(inputs, outputs)``.
        output_owners: int array ``(outputs,)``.
        k: number of workers.

    Returns:
        int64 array ``(k,)``.
    """
    fan_in = np.asarray(pattern.sum(axis=0)).ravel()
    return np.bincount(np.asarray(output_owners), weights=fan_in,
                       minlength=k).astype(np.int64)


def check_owners(owners, sizes, k):
    """``owners`` as int64 arrays, or a ``ValueError`` naming what is wrong.

    One array per level of ``sizes`` (``[n_0, ..., n_L]``), each of that
    level's length, of integers in ``[0, k)``.

    Example:
        >>> [o.tolist() for o in check_owners([[0, 1], (1, 1)], [2, 2], 2)]
        [[0, 1], [1, 1]]
    """
    k = check_positive_int("k", k)
    if not isinstance(owners, (list, tuple)) or len(owners) != len(sizes):
        raise invalid_value(
            "owners", f"a list of {len(sizes)} arrays, one per level (the inputs and each "
            "layer's outputs)", received=f"{type(owners).__name__} of "
            f"{len(owners) if hasattr(owners, '__len__') else 'no'} entries")
    checked = []
    for level, (owner, size) in enumerate(zip(owners, sizes)):
        array = np.asarray(owner)
        if array.shape != (size,) or not (array.size == 0 or np.issubdtype(array.dtype,
                                                                            np.integer)):
            raise invalid_value(
                "owners", f"owners[{level}] of {size} integers (level {level}'s neurons)",
                received=f"owners[{level}] of shape {array.shape} and dtype {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= k):
            raise invalid_value(
                "owners", f"workers in [0, k={k})",
                received=f"owners[{level}] with entries from {array.min()} to {array.max()}")
        checked.append(array.astype(np.int64))
    return checked


def communication_volume(kernels, owners, k):
    """Exact per-layer traffic and load of a partitioned network.

    Args:
        kernels: list of ``L`` kernels (scipy.sparse or arrays), kernel ``l``
            of shape ``(n_{l-1}, n_l)``.
        owners: list of ``L + 1`` int arrays, ``owners[l]`` of length ``n_l``.
        k: number of workers.

    Returns:
        ``(send, recv, load)``: int64 arrays of shape ``(L, k)``; row ``l`` is
        layer ``l + 1``: words each worker sends and receives per sample
        before that layer, and its multiply-adds per sample.

    Example:
        >>> w = [np.array([[1.0, 0.0], [1.0, 1.0]])]
        >>> send, recv, load = communication_volume(w, [[0, 1], [0, 1]], 2)
        >>> send.tolist(), recv.tolist(), load.tolist()
        ([[0, 1]], [[1, 0]], [[2, 1]])
    """
    patterns = [pattern_matrix(kernel) for kernel in kernels]
    owners = check_owners(owners, [patterns[0].shape[0]] + [p.shape[1] for p in patterns], k)
    send, recv, load = [], [], []
    for layer, pattern in enumerate(patterns):
        s, r = layer_traffic(pattern, owners[layer], owners[layer + 1], k)
        send.append(s)
        recv.append(r)
        load.append(layer_load(pattern, owners[layer + 1], k))
    return np.array(send), np.array(recv), np.array(load)
