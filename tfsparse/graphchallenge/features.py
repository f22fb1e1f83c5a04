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
"""

import math

import numpy as np
import scipy.ndimage
import scipy.sparse

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
        num_inputs: how many digits to use (all 5,000 if None).
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
    (x_train, _), (x_test, _) = load_mnist_sample()
    images = np.concatenate([x_train, x_test])
    if num_inputs is not None:
        if isinstance(num_inputs, bool) or not isinstance(num_inputs, (int, np.integer)) \
                or not 1 <= num_inputs <= len(images):
            raise invalid_value(
                "num_inputs", f"an integer in [1, {len(images)}] or None", num_inputs)
        images = images[:num_inputs]
    rows = []
    for start in range(0, len(images), _CHUNK):
        chunk = images[start:start + _CHUNK].astype(np.float32)
        factor = side / chunk.shape[1]
        resized = scipy.ndimage.zoom(chunk, (1, factor, factor), order=1, grid_mode=True,
                                     mode="grid-constant")
        binary = (resized > threshold).reshape(len(chunk), neurons)
        rows.append(scipy.sparse.csr_matrix(binary, dtype=np.float32))
    return scipy.sparse.vstack(rows, format="csr")
