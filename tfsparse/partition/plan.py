"""What each worker holds, sends and receives in a partitioned network (NumPy).

A ``LayerPlan`` describes one layer on one worker (rank): the inputs it owns,
which of them it sends to every other rank, which inputs it receives from
every rank, and its local kernel: the fan-in weights of the outputs it owns,
with rows in the local input order ``owned inputs, then the received ones
in rank order``. The distributed Keras layers execute these plans; the
plans are plain data, the same on every rank, so every rank can also compute
every other rank's plan.

Order of a message from rank ``p`` to rank ``q``: the inputs ``p`` owns and
``q`` needs, by increasing neuron index. Both ends derive it from the
partition, so nothing but the values travels.
"""

import dataclasses

import numpy as np
import scipy.sparse

from tfsparse.partition.volume import needs_matrix
from tfsparse.partition.volume import pattern_matrix


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """One layer of a partitioned network as seen by one rank.

    Attributes:
        rank: this worker.
        k: number of workers.
        owned_inputs: sorted global indices of the inputs this rank owns.
        send: ``send[q]``: positions in ``owned_inputs`` of the values sent
            to rank ``q`` (empty for ``q == rank``).
        received: ``received[q]``: global indices of the inputs received
            from rank ``q``, in message order (empty for ``q == rank``).
        local_inputs: global indices of the local input vector:
            ``owned_inputs`` then ``received[0]``, ``received[1]``, ...
        owned_outputs: sorted global indices of the outputs this rank owns.
        kernel: ``scipy.sparse.csc_matrix`` ``(len(local_inputs),
            len(owned_outputs))``: the owned columns of the global kernel.
        positions: for each stored entry of ``kernel`` in column-major order,
            its index in the global kernel's column-major (CSC) order.
    """

    rank: int
    k: int
    owned_inputs: np.ndarray
    send: tuple
    received: tuple
    local_inputs: np.ndarray
    owned_outputs: np.ndarray
    kernel: scipy.sparse.csc_matrix
    positions: np.ndarray

    @property
    def send_counts(self):
        """Values sent per sample to each rank, ``(k,)``."""
        return np.array([s.size for s in self.send], dtype=np.int64)

    @property
    def receive_counts(self):
        """Values received per sample from each rank, ``(k,)``."""
        return np.array([r.size for r in self.received], dtype=np.int64)


def _column_major(kernel):
    """CSC copy with sorted indices, duplicates summed, explicit zeros kept."""
    matrix = scipy.sparse.csc_matrix(kernel, copy=True)
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix


def layer_plan(kernel, input_owners, output_owners, rank, k):
    """Builds the plan of one layer for one rank.

    Args:
        kernel: the global kernel ``(n_in, n_out)`` (scipy.sparse or array).
        input_owners: int array ``(n_in,)``.
        output_owners: int array ``(n_out,)``.
        rank: the rank to plan for.
        k: number of workers.

    Returns:
        A ``LayerPlan``.
    """
    input_owners = np.asarray(input_owners)
    output_owners = np.asarray(output_owners)
    need = needs_matrix(pattern_matrix(kernel), output_owners, k)
    owned_inputs = np.flatnonzero(input_owners == rank)
    send = tuple(
        np.zeros(0, np.int64) if q == rank
        else np.flatnonzero(need[owned_inputs, q]).astype(np.int64)
        for q in range(k))
    received = tuple(
        np.zeros(0, np.int64) if p == rank
        else np.flatnonzero((input_owners == p) & need[:, rank])
        for p in range(k))
    local_inputs = np.concatenate([owned_inputs, *received]).astype(np.int64)
    owned_outputs = np.flatnonzero(output_owners == rank)

    matrix = _column_major(kernel)
    # Number the global nonzeros in CSC order, select the owned columns and
    # the local rows; the numbers then say where each local value lives.
    numbered = matrix.copy()
    numbered.data = np.arange(1, matrix.nnz + 1, dtype=np.float64)
    local_row = np.full(matrix.shape[0], -1, dtype=np.int64)
    local_row[local_inputs] = np.arange(local_inputs.size)
    columns = numbered[:, owned_outputs].tocoo()
    assert (local_row[columns.row] >= 0).all(), "a fan-in input is missing"
    local = scipy.sparse.csc_matrix(
        (columns.data, (local_row[columns.row], columns.col)),
        shape=(local_inputs.size, owned_outputs.size))
    local.sort_indices()
    positions = local.data.astype(np.int64) - 1
    values = matrix.data[positions]
    local_kernel = scipy.sparse.csc_matrix(
        (values, local.indices.copy(), local.indptr.copy()), shape=local.shape)
    return LayerPlan(rank, k, owned_inputs, send, received, local_inputs,
                     owned_outputs, local_kernel, positions)


def network_plans(kernels, owners, rank, k):
    """Plans of every layer for one rank.

    Args:
        kernels: list of ``L`` global kernels.
        owners: list of ``L + 1`` owner arrays (e.g. ``Partition.owners``).
        rank: the rank to plan for.
        k: number of workers.

    Returns:
        A list of ``L`` ``LayerPlan``.

    Example:
        >>> import scipy.sparse
        >>> w = [scipy.sparse.eye(4, format="csr")]
        >>> plan = network_plans(w, [[0, 0, 1, 1], [1, 0, 0, 1]], 0, 2)[0]
        >>> plan.send_counts.tolist(), plan.receive_counts.tolist()
        ([0, 1], [0, 1])
    """
    return [layer_plan(kernel, owners[layer], owners[layer + 1], rank, k)
            for layer, kernel in enumerate(kernels)]


def simulate_forward(kernels, owners, k, x, activation=None):
    """Runs the partitioned forward pass of all ranks in one process (NumPy).

    Every rank starts from the inputs it owns, takes its messages from the
    other ranks' owned values exactly as the plans say, multiplies by its
    local kernel and keeps only the outputs it owns. A check of the plans
    against ``x @ W`` without any communication library.

    Args:
        kernels: list of global kernels.
        owners: owner arrays.
        k: number of workers.
        x: array ``[batch, n_0]``.
        activation: optional function applied after every layer.

    Returns:
        ``(y, words)``: the assembled outputs ``[batch, n_L]`` and the values
        each rank sent per sample per layer, ``(L, k)``.
    """
    plans = [network_plans(kernels, owners, rank, k) for rank in range(k)]
    owned = [x[:, plans[rank][0].owned_inputs] for rank in range(k)]
    words = np.zeros((len(kernels), k), dtype=np.int64)
    for layer in range(len(kernels)):
        outgoing = [[owned[p][:, plans[p][layer].send[q]] for q in range(k)]
                    for p in range(k)]
        words[layer] = [sum(m.shape[1] for m in row) for row in outgoing]
        new_owned = []
        for rank in range(k):
            local_x = np.concatenate(
                [owned[rank]] + [outgoing[p][rank] for p in range(k)], axis=1)
            y = np.asarray(local_x @ plans[rank][layer].kernel)
            new_owned.append(activation(y) if activation else y)
        owned = new_owned
    y = np.zeros((x.shape[0], kernels[-1].shape[1]), dtype=owned[0].dtype)
    for rank in range(k):
        y[:, plans[rank][-1].owned_outputs] = owned[rank]
    return y, words
