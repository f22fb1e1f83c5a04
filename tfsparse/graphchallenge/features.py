"""Challenge-style inputs built from the real MNIST digits shipped with tfsparse.

The challenge's inputs (``sparse-images-N.tsv``) are MNIST digits resized to
``sqrt(N) x sqrt(N)`` pixels and binarised, one image per row, flattened
row-major. ``mnist_features`` builds the same kind of inputs offline from
``tfsparse.data.load_mnist_sample``: bilinear resizing of the 0-255 pixels
(``scipy.ndimage.zoom``, order 1, pixels as unit squares, zeros outside),
then every pixel above ``threshold`` becomes 1 and every other pixel 0.

The resizing method and the threshold of the official files are not known to
us; these are our choices. The default threshold 32 (1/8 of full intensity)
keeps every visibly inked pixel, so thin strokes stay connected: about 200 of
1024 pixels per digit. With the generated 1024 x 120 network (weights 1/16,
bias -0.3), 638 of the 5,000 digits end in the category set; binarising at
half intensity (127.5) instead leaves only 29 of them.

The challenge runs 60,000 inputs (the MNIST training set); 5,000 digits ship
with tfsparse, so more inputs than that repeat them in order: input ``i`` is
digit ``i mod 5000`` (60,000 inputs are the sample tiled 12 times). Rows are
independent under the challenge's rule, so the categories of tiled inputs are
those of the 5,000 digits, repeated; the work per input is the challenge's.
"""

import math
import numbers

import numpy as np
import scipy.ndimage
import scipy.sparse

from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value
from tfsparse.data import load_mnist_sample

_CHUNK = 500  # images resized at once, to bound memory for large N


def mnist_features(neurons, num_inputs=None, threshold=32.0):
    """Returns binarised, resized MNIST digits as challenge inputs.

    The digits are those of ``load_mnist_sample()`` (seed 0), the 4,000
    training digits followed by the 1,000 test digits, so any prefix mixes all
    classes.

    Args:
        neurons: neurons per layer ``N``, a perfect square (1024, 4096, 16384,
            65536 in the challenge); each image becomes ``sqrt(N) x sqrt(N)``.
        num_inputs: how many inputs to return (the 5,000 digits if None);
            beyond 5,000 the digits repeat in order (input ``i`` is digit
            ``i mod 5000``).
        threshold: resized pixels (0-255 scale) above it become 1.

    Returns:
        A float32 ``scipy.sparse.csr_matrix`` of shape ``(num_inputs, neurons)``
        with values 1.

    Example:
        >>> features = mnist_features(1024, num_inputs=100)
        >>> features.shape
        (100, 1024)
    """
    side = math.isqrt(neurons) if isinstance(neurons, (int, np.integer)) and neurons > 0 else 0
    if isinstance(neurons, bool) or side < 2 or side * side != neurons:
        raise invalid_value(
            "neurons", "a perfect square of at least 4 (images are sqrt(N) x sqrt(N))",
            neurons,
        )
    if num_inputs is not None:
        num_inputs = check_positive_int("num_inputs", num_inputs)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) \
            or not math.isfinite(threshold):
        raise invalid_value("threshold", "a finite number (0-255 scale)", threshold)
    (x_train, _), (x_test, _) = load_mnist_sample()
    images = np.concatenate([x_train, x_test])
    distinct = images[:num_inputs]
    features = _binarised(distinct, side, threshold)
    if num_inputs is None or num_inputs <= len(images):
        return features
    return features[np.arange(num_inputs) % len(images)]


def _binarised(images, side, threshold):
    """Resizes the 0-255 ``images`` to ``side x side`` and binarises them at ``threshold``."""
    neurons = side * side
    rows = []
    for start in range(0, len(images), _CHUNK):
        chunk = images[start:start + _CHUNK].astype(np.float32)
        factor = side / chunk.shape[1]
        resized = scipy.ndimage.zoom(chunk, (1, factor, factor), order=1, grid_mode=True,
                                     mode="grid-constant")
        binary = (resized > threshold).reshape(len(chunk), neurons)
        rows.append(scipy.sparse.csr_matrix(binary, dtype=np.float32))
    return scipy.sparse.vstack(rows, format="csr")
