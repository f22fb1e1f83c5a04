"""Tests of the RadiX-Net-style generator."""

import re

import numpy as np
import pytest
import scipy.sparse

from tfsparse.graphchallenge import radixnet
from tfsparse.graphchallenge import radixnet_strides
from tfsparse.graphchallenge import shift_sum_matrix


@pytest.mark.parametrize(
    "neurons, expected",
    [(1024, [1, 32]), (4096, [1, 32, 128]), (16384, [1, 32, 512]),
     (65536, [1, 32, 1024, 2048]), (100, [1, 3]), (32, [1])],
)
def test_strides_of_challenge_sizes(neurons, expected):
    strides = radixnet_strides(neurons)
    assert strides == expected
    # Every stride gives 32 distinct shifts without wrapping around.
    assert all(stride * 31 < neurons for stride in strides)


def shifts_of(matrix):
    """The set of (col - row) mod N of row 0, after checking every row has the same set."""
    neurons = matrix.shape[0]
    dense = matrix.toarray() != 0
    rows, cols = np.nonzero(dense)
    differences = ((cols - rows) % neurons).reshape(neurons, -1)
    differences.sort(axis=1)
    assert (differences == differences[0]).all(), "not a sum of cyclic shifts (not circulant)"
    return differences[0]


@pytest.mark.parametrize("neurons, connections", [(64, 4), (1024, 32), (100, 32)])
def test_every_row_and_column_has_connections_nonzeros(neurons, connections):
    weights = radixnet(neurons, 5, seed=1, connections=connections)
    assert len(weights) == 5
    for weight in weights:
        assert isinstance(weight, scipy.sparse.csr_matrix)
        assert weight.shape == (neurons, neurons) and weight.dtype == np.float32
        assert weight.has_sorted_indices
        np.testing.assert_array_equal(np.diff(weight.indptr), connections)
        np.testing.assert_array_equal(np.bincount(weight.indices, minlength=neurons), connections)
        np.testing.assert_array_equal(weight.data, np.float32(1 / 16))


def digit_forms(shifts, strides, connections, neurons):
    """All (stride, offset) with {offset + d * stride mod N : d < connections} == shifts."""
    digits = np.arange(connections)
    return [
        (stride, int(offset)) for stride in strides for offset in shifts
        if np.array_equal(np.sort((offset + stride * digits) % neurons), shifts)
    ]


def test_layers_are_sums_of_shift_matrices_over_the_radix_digits():
    neurons, connections = 64, 4
    strides = radixnet_strides(neurons, connections)
    assert strides == [1, 4, 16]
    weights = radixnet(neurons, 9, seed=5, connections=connections, weight=0.5)
    identity = np.eye(neurons)
    used = []
    for weight in weights:
        forms = digit_forms(shifts_of(weight), strides, connections, neurons)
        # One stride fits (a full cycle like 16 * 4 = 64 fits from any of its offsets).
        assert len({stride for stride, _ in forms}) == 1
        stride, offset = forms[0]
        used.append(stride)
        # The permutation-sum form written out: W = 0.5 * sum_d P^(offset + d * stride).
        expected = sum(np.roll(identity, offset + d * stride, axis=1) for d in range(connections))
        np.testing.assert_array_equal(weight.toarray(), 0.5 * expected)
    # Layers come in blocks that use every stride once.
    for block in range(3):
        assert sorted(used[3 * block:3 * block + 3]) == strides


def test_one_block_connects_every_input_to_every_output():
    neurons, connections = 64, 4
    reach = np.eye(neurons, dtype=bool)
    for weight in radixnet(neurons, 3, seed=2, connections=connections):
        reach = (reach.astype(np.int64) @ (weight.toarray() != 0)) > 0
    assert reach.all()


def test_seeded_and_reproducible():
    first = radixnet(64, 6, seed=7, connections=4)
    again = radixnet(64, 6, seed=7, connections=4)
    other = radixnet(64, 6, seed=8, connections=4)
    for a, b in zip(first, again):
        assert (a != b).nnz == 0
    assert any((a != b).nnz for a, b in zip(first, other))


def test_shift_sum_matrix_small_example():
    matrix = shift_sum_matrix(6, stride=2, connections=3, offset=1, weight=1.0).toarray()
    expected = np.zeros((6, 6))
    for row in range(6):
        expected[row, [(row + 1) % 6, (row + 3) % 6, (row + 5) % 6]] = 1
    np.testing.assert_array_equal(matrix, expected)


def test_shift_sum_matrix_rejects_repeated_shifts():
    with pytest.raises(ValueError, match="The stride 4 gives fewer than 4 distinct shifts modulo 8"):
        shift_sum_matrix(8, stride=4, connections=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(neurons=16, layers=2),
         'Received an invalid value for "neurons", expected an integer of at least connections=32 '
         "(each row needs 32 distinct shifts). Received: neurons=16"),
        (dict(neurons=1024.0, layers=2),
         'Received an invalid value for "neurons", expected an integer of at least connections=32'),
        (dict(neurons=1024, layers=0),
         'Received an invalid value for "layers", expected a positive integer. Received: layers=0'),
        (dict(neurons=1024, layers=2, connections=0),
         'Received an invalid value for "connections", expected a positive integer. '
         "Received: connections=0"),
        (dict(neurons=1024, layers=2, seed=0.5),
         'Received an invalid value for "seed", expected a non-negative integer. '
         "Received: seed=0.5"),
        (dict(neurons=1024, layers=2, seed=-1),
         'Received an invalid value for "seed", expected a non-negative integer. '
         "Received: seed=-1"),
        (dict(neurons=1024, layers=2, weight=float("nan")),
         'Received an invalid value for "weight", expected a finite nonzero number. Received: weight=nan'),
        (dict(neurons=1024, layers=2, weight="a"),  # was numpy's TypeError
         'Received an invalid value for "weight", expected a finite nonzero number. '
         "Received: weight='a'"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        radixnet(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(connections=0), "connections"),  # was a ZeroDivisionError
    (dict(connections=2, stride=0), "stride"),
    (dict(connections=2, offset=-1), "offset"),
    (dict(connections=2, weight=0), "weight"),  # was 16 stored zeros
])
def test_shift_sum_matrix_names_a_bad_argument(kwargs, name):
    arguments = {"neurons": 8, "stride": 1, **kwargs}
    with pytest.raises(ValueError, match=f'Received an invalid value for "{name}"'):
        shift_sum_matrix(**arguments)
