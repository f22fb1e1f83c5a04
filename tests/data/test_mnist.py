"""Tests of the shipped MNIST sample and of the full-set loader (IDX and Keras npz)."""

import gzip
import re
import struct

import numpy as np
import pytest

from tfsparse.data import load_mnist
from tfsparse.data import load_mnist_sample
from tfsparse.data.mnist import SAMPLE_PATH


def write_idx(path, array):
    """A minimal IDX writer: magic 0x0000 08 ndim, big-endian uint32 dims, raw uint8 data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as stream:
        stream.write(header + array.tobytes())


IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


@pytest.fixture(scope="module")
def small_split():
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    return {"x_train": x_train[:60], "y_train": y_train[:60], "x_test": x_test[:20], "y_test": y_test[:20]}


def write_idx_dir(directory, arrays, suffix="", names=IDX_NAMES):
    for key, name in names.items():
        write_idx(directory / f"{name}{suffix}", arrays[key])


def assert_split_equal(loaded, arrays):
    (x_train, y_train), (x_test, y_test) = loaded
    for key, value in zip(("x_train", "y_train", "x_test", "y_test"), (x_train, y_train, x_test, y_test)):
        assert value.dtype == np.uint8
        np.testing.assert_array_equal(value, arrays[key])


def test_sample_file_holds_real_mnist_format():
    with np.load(SAMPLE_PATH) as sample:
        images, labels = sample["images"], sample["labels"]
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (5000,) and labels.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(labels), [500] * 10)
    assert images.max() == 255 and images.min() == 0
    # MNIST digits are centred in a 20x20 box: the 2-pixel border is almost always blank.
    assert images[:, :2, :].mean() < 1.0
    assert 0.1 < (images > 127).mean() < 0.3  # ink fraction of handwritten digits


def test_sample_split_is_stratified_disjoint_and_complete():
    (x_train, y_train), (x_test, y_test) = load_mnist_sample(test_fraction=0.2, seed=0)
    assert x_train.shape == (4000, 28, 28) and x_test.shape == (1000, 28, 28)
    np.testing.assert_array_equal(np.bincount(y_train), [400] * 10)
    np.testing.assert_array_equal(np.bincount(y_test), [100] * 10)
    with np.load(SAMPLE_PATH) as sample:
        images, labels = sample["images"], sample["labels"]
    # Together the two parts are the sample again (as a multiset of (image, label) rows).
    def as_rows(x, y):
        return sorted(row.tobytes() + bytes([label]) for row, label in zip(x.reshape(len(x), -1), y))

    both = as_rows(np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test]))
    assert both == as_rows(images, labels)
    # The training part is shuffled (the file is sorted by label).
    assert len(set(y_train[:50].tolist())) > 5


def test_sample_split_is_seeded():
    (a_train, a_labels), _ = load_mnist_sample(seed=3)
    (b_train, b_labels), _ = load_mnist_sample(seed=3)
    (c_train, c_labels), _ = load_mnist_sample(seed=4)
    np.testing.assert_array_equal(a_train, b_train)
    np.testing.assert_array_equal(a_labels, b_labels)
    assert not np.array_equal(a_labels, c_labels)


def test_sample_tiny_fraction_keeps_every_class_in_both_parts():
    (_, y_train), (_, y_test) = load_mnist_sample(test_fraction=0.0001)
    np.testing.assert_array_equal(np.bincount(y_test), [1] * 10)
    assert len(y_train) == 4990


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, "0.2", None])
def test_sample_rejects_bad_test_fraction(value):
    message = (
        'Received an invalid value for "test_fraction", expected a float in (0, 1). '
        f"Received: test_fraction={value!r}"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        load_mnist_sample(test_fraction=value)


@pytest.mark.parametrize("seed", [1.5, -1, True])  # -1 was NumPy's error, naming no seed
def test_sample_rejects_bad_seed(seed):
    with pytest.raises(ValueError, match=re.escape(
            f'"seed", expected a non-negative integer. Received: seed={seed!r}')):
        load_mnist_sample(seed=seed)


def test_sample_takes_numpy_numbers():
    # np.float32(0.2) was refused as not "a float in (0, 1)".
    (_, y_train), (_, y_test) = load_mnist_sample(np.float32(0.2), np.int64(3))
    assert (len(y_train), len(y_test)) == (4000, 1000)


def test_load_mnist_names_a_path_of_another_type_and_an_unreadable_array(tmp_path):
    with pytest.raises(ValueError, match='"path", expected a directory or an .npz file'):
        load_mnist(None)
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=np.array([object()]), y_train=np.zeros(1, np.uint8),
             x_test=np.zeros((1, 2, 2), np.uint8), y_test=np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match=re.escape(f"Cannot read the MNIST file '{path}'")):
        load_mnist(path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_load_mnist_reads_idx_files(tmp_path, small_split, suffix):
    write_idx_dir(tmp_path, small_split, suffix)
    assert_split_equal(load_mnist(tmp_path), small_split)


def test_load_mnist_reads_dotted_idx_names(tmp_path, small_split):
    dotted = {key: name.replace("-idx", ".idx") for key, name in IDX_NAMES.items()}
    write_idx_dir(tmp_path, small_split, names=dotted)
    assert_split_equal(load_mnist(str(tmp_path)), small_split)


def test_load_mnist_reads_keras_npz_file_and_directory(tmp_path, small_split):
    np.savez(tmp_path / "mnist.npz", **small_split)
    assert_split_equal(load_mnist(tmp_path / "mnist.npz"), small_split)
    assert_split_equal(load_mnist(tmp_path), small_split)


def test_load_mnist_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "nowhere")


def test_load_mnist_missing_files_are_named(tmp_path, small_split):
    write_idx_dir(tmp_path, small_split)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("Missing: t10k-labels-idx1-ubyte; no 'mnist.npz'")):
        load_mnist(tmp_path)


def test_load_mnist_bad_magic_number(tmp_path, small_split):
    write_idx_dir(tmp_path, small_split)
    # Images written where labels belong: 3 dimensions where 1 is expected.
    write_idx(tmp_path / "train-labels-idx1-ubyte", small_split["x_train"])
    with pytest.raises(ValueError, match=re.escape("expected the magic number 0x00000801")):
        load_mnist(tmp_path)


def test_load_mnist_truncated_file(tmp_path, small_split):
    write_idx_dir(tmp_path, small_split)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    expected_bytes = 16 + 20 * 28 * 28
    with pytest.raises(ValueError, match=re.escape(f"needs {expected_bytes} bytes. Received: {expected_bytes - 5} bytes")):
        load_mnist(tmp_path)


def test_load_mnist_header_whose_size_wraps_int64(tmp_path, small_split):
    # 2**31 * 2**31 * 4 bytes is 2**64: counted in int64 it wrapped to 0 and
    # a 16-byte file passed the length check (then a bare reshape error).
    write_idx_dir(tmp_path, small_split)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 2**31, 2**31, 4))
    with pytest.raises(ValueError, match=re.escape(
            f"Malformed IDX file '{path}': a shape of (2147483648, 2147483648, 4) needs "
            f"{16 + 2**64} bytes. Received: 16 bytes.")):
        load_mnist(tmp_path)

def test_load_mnist_count_mismatch(tmp_path, small_split):
    write_idx_dir(tmp_path, small_split)
    write_idx(tmp_path / "train-labels-idx1-ubyte", small_split["y_train"][:59])
    with pytest.raises(ValueError, match=re.escape("Received: 60 images, 59 labels")):
        load_mnist(tmp_path)


def test_load_mnist_label_out_of_range(tmp_path, small_split):
    arrays = dict(small_split, y_test=np.full(20, 12, np.uint8))
    write_idx_dir(tmp_path, arrays)
    with pytest.raises(ValueError, match=re.escape("expected labels 0-9. Received: a label 12")):
        load_mnist(tmp_path)


def test_load_mnist_npz_missing_arrays(tmp_path, small_split):
    np.savez(tmp_path / "mnist.npz", x_train=small_split["x_train"], y_train=small_split["y_train"])
    with pytest.raises(ValueError, match=re.escape("Missing: x_test, y_test")):
        load_mnist(tmp_path / "mnist.npz")


def test_load_mnist_not_an_npz(tmp_path):
    path = tmp_path / "mnist.npz"
    path.write_bytes(b"this is not a zip archive")
    with pytest.raises(ValueError, match="Cannot read the MNIST file"):
        load_mnist(path)


def test_load_mnist_corrupt_gzip(tmp_path, small_split):
    write_idx_dir(tmp_path, small_split, ".gz")
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bgarbage")
    with pytest.raises(ValueError, match="Cannot read the IDX file"):
        load_mnist(tmp_path)
