"""RadiX-Net-style networks for the Sparse DNN Graph Challenge, generated offline.

A RadiX-Net layer connects neuron ``i`` to the neurons ``i + d * p (mod N)``
for the digits ``d = 0 .. r - 1`` of one position of a mixed-radix number
system with radix ``r`` and place value ``p``: its weight matrix is a sum of
cyclic shift (permutation) matrices ``W = sum_d P^(d * p)``. Consecutive layers
use the different positions, so a few layers connect every input to every
output.

The official challenge networks were generated from radix lists and weight
values that are not published with the files we know of. tfsparse chooses:

- radix ``connections`` (32) in every layer, so every row and every column
  has exactly ``connections`` nonzeros;
- place values (strides) ``1, c, c^2, ...`` (``c = connections``) while
  ``stride * c <= N``, then ``N // c`` when ``N`` is not a power of ``c``
  (1024: strides 1 and 32; 4096: 1, 32, 128; 16384: 1, 32, 512; 65536: 1, 32,
  1024, 2048). Each stride gives ``c`` distinct shifts (``stride * (c - 1) <
  N``), and for the challenge's sizes one block of layers using every stride
  once reaches every output from every input, as RadiX-Nets do (not for
  every N: for 1000, strides 1 and 31 reach 993 outputs from each input);
- layers come in blocks of ``len(strides)``; the order of the strides inside a
  block and a cyclic offset ``o_l`` per layer are drawn from
  ``numpy.random.default_rng(seed)``, so layer ``l`` is
  ``W_l = P^(o_l) * sum_d P^(d * stride_l)``, still a sum of cyclic shifts;
- every nonzero weight equals ``weight`` (default 1/16, the value we believe
  the public files use for all sizes; our choice, not a verified fact).

Every layer is circulant, and ReLU and the clip act elementwise, so the
offsets only rotate the activations: the categories of a generated network
depend on the stride order, not on the offsets.
"""

import numbers

import numpy as np
import scipy.sparse

from tfsparse._validation import check_non_negative_int
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value

DEFAULT_CONNECTIONS = 32
DEFAULT_WEIGHT = 1.0 / 16.0


def radixnet_strides(neurons, connections=DEFAULT_CONNECTIONS):
    """Returns the place values (strides) of the mixed radix used for ``neurons``.

    Args:
        neurons: neurons per layer ``N``, an integer ``>= connections``.
        connections: nonzeros per row and column ``c``, a positive integer.

    Returns:
        A list of distinct strides ``s`` with ``s * (connections - 1) < N``.

    Example:
        >>> radixnet_strides(4096)
        [1, 32, 128]
    """
    _check_sizes(neurons, connections)
    if connections == 1:
        return [1]
    strides, place = [], 1
    while place * connections <= neurons:
        strides.append(place)
        place *= connections
    last = neurons // connections
    if last not in strides:
        strides.append(last)
    return strides


def radixnet(neurons, layers, seed=0, connections=DEFAULT_CONNECTIONS, weight=DEFAULT_WEIGHT):
    """Generates a RadiX-Net-style network: ``layers`` sparse ``neurons x neurons`` weights.

    See the module docstring for the radix, stride, offset and weight choices.

    Args:
        neurons: neurons per layer ``N``, an integer ``>= connections``.
        layers: number of layers ``L``, a positive integer.
        seed: integer seed of the stride order and the offsets.
        connections: nonzeros per row and per column (32 in the challenge).
        weight: the value of every nonzero.

    Returns:
        A list of ``layers`` ``scipy.sparse.csr_matrix`` of dtype float32 and
        shape ``(neurons, neurons)`` with sorted indices, in the row-vector
        convention of the challenge (``Y_next = Y @ W``).

    Example:
        >>> weights = radixnet(1024, 120)
        >>> len(weights), weights[0].shape, weights[0].nnz
        (120, (1024, 1024), 32768)
    """
    strides = radixnet_strides(neurons, connections)
    check_positive_int("layers", layers)
    seed = check_non_negative_int("seed", seed)
    _check_weight(weight)
    rng = np.random.default_rng(seed)
    layer_strides = []
    while len(layer_strides) < layers:
        layer_strides.extend(rng.permutation(strides).tolist())
    offsets = rng.integers(0, neurons, size=layers)
    return [
        shift_sum_matrix(neurons, stride, connections, int(offset), weight)
        for stride, offset in zip(layer_strides[:layers], offsets)
    ]


def shift_sum_matrix(neurons, stride, connections, offset=0, weight=DEFAULT_WEIGHT):
    """Returns ``weight * sum_{d < connections} P^(offset + d * stride)`` as CSR.

    ``P`` is the cyclic shift with ``P[i, (i + 1) % neurons] = 1``, so row
    ``i`` has its nonzeros in the columns ``(i + offset + d * stride) % neurons``.

    Example:
        >>> shift_sum_matrix(8, stride=2, connections=2).toarray()[0].tolist()
        [0.0625, 0.0, 0.0625, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    _check_sizes(neurons, connections)
    check_positive_int("stride", stride)
    check_non_negative_int("offset", offset)
    _check_weight(weight)
    shifts = (offset + stride * np.arange(connections, dtype=np.int64)) % neurons
    if len(np.unique(shifts)) != connections:
        raise ValueError(
            f"The stride {stride} gives fewer than {connections} distinct shifts "
            f"modulo {neurons} neurons."
        )
    columns = (np.arange(neurons, dtype=np.int64)[:, None] + shifts[None, :]) % neurons
    columns.sort(axis=1)
    indptr = np.arange(0, neurons * connections + 1, connections, dtype=np.int64)
    data = np.full(neurons * connections, weight, dtype=np.float32)
    matrix = scipy.sparse.csr_matrix(
        (data, columns.ravel().astype(np.int32), indptr.astype(np.int32)),
        shape=(neurons, neurons),
    )
    matrix.has_sorted_indices = True
    return matrix


def _check_weight(weight):
    real = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
    if not real or not np.isfinite(weight) or weight == 0:
        raise invalid_value("weight", "a finite nonzero number", weight)


def _check_sizes(neurons, connections):
    check_positive_int("connections", connections)
    if (
        not isinstance(neurons, (int, np.integer))
        or isinstance(neurons, bool)
        or neurons < connections
    ):
        raise invalid_value(
            "neurons", f"an integer of at least connections={connections} (each row "
            f"needs {connections} distinct shifts)", neurons,
        )
