"""Inference with the Graph Challenge's rule, through tfsparse and through SciPy.

The challenge's reference rule, in the row-vector convention, for every layer
``l``::

    Z = Y @ W_l
    Y = Z + b    where Z != 0 (the bias is added to the nonzeros only), else 0
    Y = min(max(Y, 0), 32)

The answer is the set of inputs (rows) whose final activations have a nonzero
sum. The rate is ``inputs * edges / seconds`` with ``edges`` the nonzeros of
all layers.
"""

import functools
import types
from typing import NamedTuple

import numpy as np
import scipy.sparse
import tensorflow as tf
import tqdm

from tfsparse._validation import invalid_value
from tfsparse.graphchallenge._active_rows import run_active_rows
from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul

CLIP = 32.0
_DEFAULT_BIASES = {1024: -0.3, 4096: -0.35, 16384: -0.4, 65536: -0.45}
# Auto batch size: about 2^24 activations (64 MiB in float32) per batch.
_BATCH_ELEMENTS = 1 << 24


def default_bias(neurons):
    """Returns the challenge's bias for a network of ``neurons`` per layer.

    Example:
        >>> default_bias(1024)
        -0.3
    """
    if neurons not in _DEFAULT_BIASES:
        raise invalid_value(
            "neurons", f"one of the challenge's sizes {sorted(_DEFAULT_BIASES)} (pass a "
            "bias explicitly for other sizes)", neurons,
        )
    return _DEFAULT_BIASES[neurons]


def categories(activations):
    """Returns the 0-based indices of the rows with a nonzero sum, sorted.

    Example:
        >>> categories(np.array([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]]))
        array([0, 2])
    """
    if scipy.sparse.issparse(activations):
        sums = np.asarray(activations.sum(axis=1)).ravel()
    else:
        sums = np.asarray(activations).sum(axis=1)
    return np.flatnonzero(sums != 0)


class PreparedNetwork(NamedTuple):
    """A network converted once for ``inference``: per layer the tensors
    ``(values, rows, cols, row_major_order)`` of its ``SparsityPattern``."""

    neurons: int
    layers: tuple
    edges: int


def prepare_network(weights):
    """Converts ``scipy.sparse`` layers into tfsparse's tensors, once.

    ``inference`` does this itself when given the matrices; preparing ahead
    keeps the conversion out of timed runs (as the challenge times inference,
    not loading).

    Example:
        >>> from tfsparse.graphchallenge import radixnet
        >>> network = prepare_network(radixnet(1024, 2))
        >>> network.neurons, len(network.layers), network.edges
        (1024, 2, 65536)
    """
    weights = _check_weights(weights)
    for index, weight in enumerate(weights):
        # float32 as the layers compute: 1e39 would be inf, and 0 * inf NaN
        # where SciPy's product skips the zero activation.
        _check_finite(f"weights[{index}]", weight)
    neurons = weights[0].shape[0]
    return PreparedNetwork(neurons, tuple(_layer_tensors(w) for w in weights), count_edges(weights))


def count_edges(weights):
    """Returns the number of nonzeros of all layers (the challenge's edges).

    Stored zeros are not edges, and duplicate entries of a position are one
    (``count_nonzero``, not ``nnz``).

    Example:
        >>> import scipy.sparse
        >>> count_edges([scipy.sparse.coo_matrix(([1.0, 2.0, 0.0], ([0, 0, 1], [1, 1, 0])),
        ...                                      shape=(2, 2))])
        1
    """
    return int(sum(weight.count_nonzero() for weight in weights))


def inference(features, weights, bias, batch_size=None, progress=True):
    """Runs the challenge's inference with tfsparse's sparse kernels.

    The inputs are processed in batches of dense rows; each layer is one
    ``tfsparse.ops.sparse_matmul`` (tfsparse's SpMM kernel on CPU) followed by
    the bias-on-nonzeros, ReLU and clip, inside one ``tf.function``. A row
    that becomes all zero is dropped in that layer (it stays zero), and the
    survivors of different batches are merged into full batches again (see
    ``tfsparse/graphchallenge/_active_rows.py``); the result is the same as
    running every row through every layer.

    Args:
        features: the inputs ``Y_0``, a ``scipy.sparse`` matrix or array of
            shape ``(inputs, neurons)``.
        weights: the layers, ``scipy.sparse`` matrices of shape
            ``(neurons, neurons)`` (e.g. from ``radixnet`` or ``load_network``),
            or a ``PreparedNetwork`` from ``prepare_network``.
        bias: the scalar bias (``default_bias(neurons)`` for the challenge).
        batch_size: inputs per batch; ``None`` picks about 2^24 activations
            per batch (16384 rows for 1024 neurons).
        progress: show a tqdm progress bar counting input-layers (a row that
            dies counts for all its remaining layers).

    Returns:
        The final activations, a float32 ``scipy.sparse.csr_matrix`` of shape
        ``(inputs, neurons)``.

    Example:
        >>> from tfsparse.graphchallenge import mnist_features, radixnet
        >>> weights = radixnet(1024, 4)
        >>> features = mnist_features(1024, num_inputs=10)
        >>> activations = inference(features, weights, -0.3, progress=False)
        >>> activations.shape
        (10, 1024)
    """
    if not isinstance(weights, PreparedNetwork):
        weights = prepare_network(weights)
    features, neurons, bias = _check_arguments(features, weights, bias)
    batch_size = _check_batch_size(batch_size, neurons)
    with tqdm.tqdm(
        total=features.shape[0] * len(weights.layers),
        desc="tfsparse inference",
        unit=" input-layers",
        unit_scale=True,
        disable=not progress,
    ) as bar:
        return run_active_rows(features, weights.layers, _layer_step(neurons, bias),
                               batch_size, bar)


def inference_scipy(features, weights, bias, progress=False):
    """The serial reference: sparse ``Y`` times sparse ``W`` with SciPy CSR.

    Args:
        features: ``(inputs, neurons)`` sparse matrix or array.
        weights: ``scipy.sparse`` layers of shape ``(neurons, neurons)``.
        bias: the scalar bias.
        progress: show a tqdm progress bar over the layers.

    Returns:
        The final activations, a float32 ``scipy.sparse.csr_matrix``.

    Example:
        >>> y = inference_scipy(np.eye(2), [scipy.sparse.eye(2, format="csr")], -0.5)
        >>> y.toarray()
        array([[0.5, 0. ],
               [0. , 0.5]], dtype=float32)
    """
    y, _, bias = _check_arguments(features, weights, bias)
    weights = [scipy.sparse.csr_matrix(weight, dtype=np.float32) for weight in weights]
    for weight in tqdm.tqdm(weights, desc="scipy inference", unit="layer", disable=not progress):
        z = y @ weight
        z.eliminate_zeros()  # the bias goes to the nonzeros of Z only
        z.data += np.float32(bias)
        np.clip(z.data, 0.0, CLIP, out=z.data)
        z.eliminate_zeros()
        y = z
    return y


def _layer_tensors(weight):
    """``(values, rows, cols, row_major_order)`` tensors of one layer."""
    pattern, values = SparsityPattern.from_scipy(weight)
    return (
        tf.constant(values, tf.float32),
        tf.constant(pattern.rows),
        tf.constant(pattern.cols),
        tf.constant(pattern.row_major_order),
    )


@functools.lru_cache(maxsize=8)
def _layer_step(neurons, bias):
    """One traced function for every layer: the layers differ only in tensors.

    Cached, so repeated ``inference`` calls of one size reuse the trace.
    """
    bias_is_not_positive = bias <= 0
    bias = tf.constant(bias, tf.float32)
    index = tf.TensorSpec([None], tf.int32)

    @tf.function(
        input_signature=[tf.TensorSpec([None, neurons], tf.float32),
                         tf.TensorSpec([None], tf.float32), index, index, index]
    )
    def step(y, values, rows, cols, row_major_order):
        pattern = types.SimpleNamespace(
            rows=rows, cols=cols, row_major_order=row_major_order, shape=(neurons, neurons)
        )
        z = sparse_matmul(y, values, pattern)
        if bias_is_not_positive:
            # Where Z == 0, Z + b = b <= 0 clips to 0 anyway: the mask is a no-op.
            y = tf.clip_by_value(z + bias, 0.0, CLIP)
        else:
            y = tf.where(tf.not_equal(z, 0.0), tf.clip_by_value(z + bias, 0.0, CLIP), 0.0)
        return y, tf.reduce_any(tf.not_equal(y, 0.0), axis=1)

    return step


def _check_weights(weights):
    weights = list(weights)
    if not weights:
        raise invalid_value("weights", "a non-empty list of sparse matrices", weights)
    neurons = getattr(weights[0], "shape", (0,))[0]
    for index, weight in enumerate(weights):
        if not scipy.sparse.issparse(weight) or weight.shape != (neurons, neurons):
            received = getattr(weight, "shape", type(weight).__name__)
            raise invalid_value(
                "weights", f"square sparse matrices of one shape ({neurons}, {neurons})",
                received=f"weights[{index}] of shape {received}",
            )
    return weights


def _check_finite(name, matrix):
    """Raises unless every stored value of ``matrix`` is finite in float32."""
    data = np.asarray(matrix.data)
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(data.astype(np.float32, copy=False))
    if not finite.all():
        bad = data[np.flatnonzero(~finite)[0]]
        raise invalid_value(name, "values finite in float32 (|value| <= 3.4e38)",
                            received=f"{name} holding {bad!r}")


def _check_arguments(features, weights, bias):
    """Returns (CSR float32 features, neurons, float bias) after checking them."""
    features = scipy.sparse.csr_matrix(features)
    _check_finite("features", features)
    features = features.astype(np.float32, copy=False)
    if isinstance(weights, PreparedNetwork):
        neurons = weights.neurons
    else:
        neurons = _check_weights(weights)[0].shape[0]
    if features.shape[1] != neurons:
        raise invalid_value(
            "features", f"a matrix of {neurons} columns (the neurons of the network)",
            received=f"features of shape {features.shape}",
        )
    if isinstance(bias, bool) or not isinstance(bias, (int, float, np.floating, np.integer)) \
            or not np.isfinite(bias):
        raise invalid_value("bias", "a finite number", bias)
    return features, neurons, float(bias)


def _check_batch_size(batch_size, neurons):
    if batch_size is None:
        return max(1, _BATCH_ELEMENTS // neurons)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise invalid_value("batch_size", "a positive integer or None", batch_size)
    return int(batch_size)
