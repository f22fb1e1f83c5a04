"""Tests of the challenge's TSV readers and writers."""

import gzip
import re
import shutil

import numpy as np
import pytest
import scipy.sparse

from tfsparse.graphchallenge import load_categories
from tfsparse.graphchallenge import load_features
from tfsparse.graphchallenge import load_network
from tfsparse.graphchallenge import radixnet
from tfsparse.graphchallenge import write_categories
from tfsparse.graphchallenge import write_features
from tfsparse.graphchallenge import write_network


def random_weights(neurons, layers, seed=0):
    rng = np.random.default_rng(seed)
    return [
        scipy.sparse.random(neurons, neurons, density=0.2, format="csr", dtype=np.float32, rng=rng)
        for _ in range(layers)
    ]


def assert_same(a, b):
    assert a.shape == b.shape and a.dtype == np.float32
    assert (a != b).nnz == 0


def test_network_round_trip(tmp_path):
    weights = radixnet(64, 3, connections=4) + random_weights(64, 2)
    paths = write_network(tmp_path, weights)
    assert [path.relative_to(tmp_path).as_posix() for path in paths] == [
        f"neuron64/n64-l{k}.tsv" for k in range(1, 6)]
    assert paths[0].read_text().splitlines()[0].split("\t")[2] == "0.0625"
    for loaded, original in zip(load_network(tmp_path, 64, 5), weights):
        assert_same(loaded, original)  # %.9g round-trips float32 exactly


def test_network_files_directly_in_data_dir(tmp_path):
    weights = random_weights(16, 2)
    write_network(tmp_path / "staging", weights)
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in (tmp_path / "staging" / "neuron16").iterdir():
        shutil.copy(path, flat / path.name)
    for loaded, original in zip(load_network(flat, 16, 2), weights):
        assert_same(loaded, original)


def test_gzip_files(tmp_path):
    weights = random_weights(16, 1)
    (path,) = write_network(tmp_path, weights)
    with open(path, "rb") as plain, gzip.open(path.with_name(path.name + ".gz"), "wb") as packed:
        packed.write(plain.read())
    path.unlink()
    assert_same(load_network(tmp_path, 16, 1)[0], weights[0])
    features_path = tmp_path / "sparse-images-16.tsv.gz"
    write_features(features_path, weights[0])
    assert gzip.open(features_path).read(1)  # really gzip
    assert_same(load_features(features_path, 16, num_inputs=16), weights[0])
    write_network(tmp_path / "bad", weights)
    bad = tmp_path / "bad" / "neuron16" / "n16-l1.tsv.gz"
    with gzip.open(bad, "wt") as stream:
        stream.write("1\t1\t1\n1\t1\n")
    (tmp_path / "bad" / "neuron16" / "n16-l1.tsv").unlink()
    with pytest.raises(ValueError, match=re.escape(f"Malformed line 2 in '{bad}'")):
        load_network(tmp_path / "bad", 16, 1)


def test_missing_layer_file_is_named(tmp_path):
    write_network(tmp_path, random_weights(16, 2))
    with pytest.raises(FileNotFoundError, match=re.escape("n16-l3.tsv")):
        load_network(tmp_path, 16, 3)


def test_features_round_trip(tmp_path):
    features = scipy.sparse.random(7, 16, density=0.3, format="csr", dtype=np.float32, rng=1)
    features = scipy.sparse.vstack([features, scipy.sparse.csr_matrix((2, 16), dtype=np.float32)]).tocsr()
    path = tmp_path / "sparse-images-16.tsv"
    write_features(path, features)
    assert_same(load_features(path, 16, num_inputs=9), features)
    # Without num_inputs the trailing empty rows cannot be known.
    assert load_features(path, 16).shape == (features.getnnz(axis=1).nonzero()[0].max() + 1, 16)


def test_categories_round_trip(tmp_path):
    path = tmp_path / "neuron16-l2-categories.tsv"
    write_categories(path, [0, 3, 10])
    assert path.read_text().split() == ["1", "4", "11"]
    np.testing.assert_array_equal(load_categories(path), [0, 3, 10])
    write_categories(path, [])
    assert load_categories(path).size == 0
    with pytest.raises(ValueError, match=re.escape("expected non-negative 0-based row ids. Received: an id -1")):
        write_categories(path, [3, -1])
    # Fractions and booleans were written as other ids (2.2 as id 3).
    for ids in ([0.7, 2.2], [True, False]):
        with pytest.raises(ValueError, match=re.escape('"ids", expected integer 0-based row ids')):
            write_categories(path, ids)
    write_categories(path, np.array([4.0, 7.0]))  # integral floats are ids
    np.testing.assert_array_equal(load_categories(path), [4, 7])


MALFORMED_TRIPLES = [
    ("1\t2\n", "(3 fields)"),
    ("1\t2\t0.5\t7\n", "(3 fields)"),
    ("1\tx\t0.5\n", "(numbers)"),
    ("0\t2\t0.5\n", "(row and column integers >= 1)"),
    ("1.5\t2\t0.5\n", "(row and column integers >= 1)"),
    ("1\t17\t0.5\n", "(column <= 16)"),
    ("17\t1\t0.5\n", "(row <= 16)"),
    ("1\t2\tnan\n", "(finite numbers)"),
    # Finite in float64 but inf once kept in float32: tfsparse and SciPy then disagreed.
    ("1\t2\t1e39\n", "(values of magnitude <= 3.402823e+38, finite in float32)"),
]


@pytest.mark.parametrize("bad_line, problem", MALFORMED_TRIPLES)
def test_malformed_weight_line_names_file_and_line(tmp_path, bad_line, problem):
    directory = tmp_path / "neuron16"
    directory.mkdir()
    path = directory / "n16-l1.tsv"
    # Line 4 is bad; the blank line 2 still counts.
    path.write_text("1\t1\t0.0625\n\n2\t3\t0.0625\n" + bad_line + "5\t5\t0.0625\n")
    message = (f"Malformed line 4 in '{path}': expected 'row col value' with integer row and "
               f"column counted from 1 {problem}. Received: {bad_line.rstrip()!r}")
    with pytest.raises(ValueError, match=re.escape(message)):
        load_network(tmp_path, 16, 1)


def test_repeated_weight_entry_names_the_line(tmp_path):
    path = tmp_path / "n16-l1.tsv"
    path.write_text("1\t1\t1\n2\t2\t1\n\n1\t1\t1\n")
    with pytest.raises(ValueError, match=re.escape(
            f"Malformed line 4 in '{path}': expected each (row, col) once. Received: a repeated entry (1, 1).")):
        load_network(tmp_path, 16, 1)


def test_malformed_features_line(tmp_path):
    path = tmp_path / "sparse-images-16.tsv"
    path.write_text("1 1 1\n2 20 1\n")
    with pytest.raises(ValueError, match=re.escape(f"Malformed line 2 in '{path}'") + ".*column <= 16"):
        load_features(path, 16)
    with pytest.raises(ValueError, match=re.escape("(row <= 1)")):
        path.write_text("1 1 1\n2 2 1\n")
        load_features(path, 16, num_inputs=1)


ID_RANGE = "(an integer in [1, 2147483647])"


@pytest.mark.parametrize("bad_line, problem", [("0", ID_RANGE), ("2.5", ID_RANGE), ("1e20", ID_RANGE),
                                               ("3 4", "(1 field)"), ("seven", "(numbers)")])
def test_malformed_categories_line(tmp_path, bad_line, problem):
    path = tmp_path / "neuron16-l2-categories.tsv"
    path.write_text(f"1\n2\n{bad_line}\n")
    message = (f"Malformed line 3 in '{path}': expected one integer image id counted from 1 "
               f"{problem}. Received: {bad_line!r}")
    with pytest.raises(ValueError, match=re.escape(message)):
        load_categories(path)


def test_repeated_category_is_an_error(tmp_path):
    path = tmp_path / "neuron16-l2-categories.tsv"
    path.write_text("1\n4\n4\n")
    with pytest.raises(ValueError, match=re.escape(
            f"Malformed file '{path}': expected each image id once. Received: 4 more than once.")):
        load_categories(path)


def test_an_input_id_beyond_int32_names_its_line(tmp_path):
    # 1e20 raised OverflowError; 2**40 asked for a matrix of 2**40 rows.
    path = tmp_path / "sparse-images-16.tsv"
    for row in ("1e20", str(2**40)):
        path.write_text(f"1 1 1\n{row} 2 1\n")
        with pytest.raises(ValueError, match=re.escape(f"Malformed line 2 in '{path}'") +
                           ".*row <= 2147483647"):
            load_features(path, 16)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_features(tmp_path / "sparse-images-16.tsv", 16)


def test_invalid_sizes(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            'Received an invalid value for "layers", expected a positive integer. Received: layers=0')):
        load_network(tmp_path, 16, 0)


@pytest.mark.parametrize("content", [b"", b"1\t1\t1\n"], ids=["truncated gzip", "not gzip"])
def test_a_corrupt_gz_file_is_named(tmp_path, content):
    path = tmp_path / "sparse-images-16.tsv.gz"
    lines = "".join(f"{i}\t{i % 16 + 1}\t1\n" for i in range(1, 400)).encode()
    path.write_bytes(content or gzip.compress(lines)[:len(gzip.compress(lines)) // 2])
    with pytest.raises(ValueError, match=re.escape(
            f"The challenge file '{path}' cannot be read as a text table of numbers (")):
        load_features(path, 16)


def test_a_file_that_is_not_utf8_text_is_named(tmp_path):
    path = tmp_path / "sparse-images-16.tsv"
    path.write_bytes("1\t1\t1\n".encode("utf-16"))
    with pytest.raises(ValueError, match=re.escape(
            f"The challenge file '{path}' cannot be read as a text table of numbers "
            "(UnicodeDecodeError")):
        load_features(path, 16)
