"""Reading and writing the Graph Challenge's TSV files.

Layout of the official data (``N`` neurons, ``L`` layers), all 1-based:

- weights ``neuron{N}/n{N}-l{k}.tsv`` (``k = 1 .. L``): ``row<TAB>col<TAB>value``;
- inputs ``sparse-images-{N}.tsv``: ``image<TAB>pixel<TAB>value``;
- truth ``neuron{N}-l{L}-categories.tsv``: one image id per line.

Any whitespace separates fields; blank lines are skipped; a name ending in
``.gz`` is read and written gzip-compressed. A malformed line raises a
``ValueError`` naming the file and the line number.
"""

import gzip
import pathlib
import warnings

import numpy as np
import scipy.sparse

from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value

_TRIPLE = "'row col value' with integer row and column counted from 1"


def load_network(data_dir, neurons, layers):
    """Reads the ``layers`` weight matrices of an ``neurons``-wide challenge network.

    Looks for ``data_dir/neuron{N}/n{N}-l{k}.tsv``, then
    ``data_dir/n{N}-l{k}.tsv`` (each also with ``.gz``).

    Args:
        data_dir: the directory of the challenge's files.
        neurons: neurons per layer ``N``.
        layers: number of layers ``L``.

    Returns:
        A list of ``layers`` float32 ``scipy.sparse.csr_matrix`` of shape
        ``(neurons, neurons)``.

    Example:
        >>> import tempfile
        >>> from tfsparse.graphchallenge import radixnet
        >>> directory = tempfile.mkdtemp()
        >>> paths = write_network(directory, radixnet(1024, 2))
        >>> [weight.nnz for weight in load_network(directory, 1024, 2)]
        [32768, 32768]
    """
    data_dir = pathlib.Path(data_dir)
    check_positive_int("neurons", neurons)
    check_positive_int("layers", layers)
    weights = []
    for layer in range(1, layers + 1):
        name = f"n{neurons}-l{layer}.tsv"
        candidates = [data_dir / f"neuron{neurons}" / name, data_dir / name]
        path = _first_existing(candidates)
        rows, cols, values = _read_triples(path, max_row=neurons, max_col=neurons)
        weights.append(_to_csr(path, rows, cols, values, (neurons, neurons)))
    return weights


def load_features(path, neurons, num_inputs=None):
    """Reads ``sparse-images-{N}.tsv``: one input per row, ``neurons`` columns.

    Args:
        path: the TSV file.
        neurons: neurons per layer (the number of columns).
        num_inputs: the number of inputs; by default the largest row id
            (trailing all-zero inputs, absent from the file, need it).

    Returns:
        A float32 ``scipy.sparse.csr_matrix`` of shape ``(num_inputs, neurons)``.

    Example:
        >>> import os, tempfile
        >>> from tfsparse.graphchallenge import mnist_features
        >>> path = os.path.join(tempfile.mkdtemp(), "sparse-images-1024.tsv")
        >>> write_features(path, mnist_features(1024, num_inputs=3))
        >>> load_features(path, 1024).shape
        (3, 1024)
    """
    check_positive_int("neurons", neurons)
    if num_inputs is not None:
        check_positive_int("num_inputs", num_inputs)
    path = pathlib.Path(path)
    rows, cols, values = _read_triples(path, max_row=num_inputs, max_col=neurons)
    if num_inputs is None:
        num_inputs = int(rows.max()) + 1 if rows.size else 0
    return _to_csr(path, rows, cols, values, (num_inputs, neurons))


def load_categories(path):
    """Reads a truth file ``neuron{N}-l{L}-categories.tsv`` (1-based row ids).

    Returns:
        The 0-based ids as a sorted int64 array.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "neuron1024-l120-categories.tsv")
        >>> write_categories(path, [0, 5])
        >>> load_categories(path)
        array([0, 5])
    """
    path = pathlib.Path(path)
    table = _load_table(path, fields=1, layout="one integer image id counted from 1")
    ids = table[:, 0]
    bad = np.flatnonzero((ids < 1) | (ids > _MAX_ID) | (ids != np.floor(ids)))
    if bad.size:
        _raise_for_first_bad_line(path, fields=1, layout="one integer image id counted from 1",
                                  check=_id_problem)
    ids = np.sort(ids.astype(np.int64) - 1)
    repeated = np.flatnonzero(ids[1:] == ids[:-1])
    if repeated.size:
        raise ValueError(f"Malformed file '{path}': expected each image id once. Received: "
                         f"{ids[repeated[0]] + 1} more than once.")
    return ids


def write_network(data_dir, weights):
    """Writes ``weights`` as ``data_dir/neuron{N}/n{N}-l{k}.tsv`` (1-based).

    Returns:
        The list of written paths.

    Example: see ``load_network``.
    """
    weights = list(weights)
    if not weights:
        raise invalid_value("weights", "a non-empty list of sparse matrices", weights)
    neurons = weights[0].shape[0]
    directory = pathlib.Path(data_dir) / f"neuron{neurons}"
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, weight in enumerate(weights, start=1):
        path = directory / f"n{neurons}-l{layer}.tsv"
        _write_triples(path, weight)
        paths.append(path)
    return paths


def write_features(path, features):
    """Writes an ``(inputs, neurons)`` matrix as ``image pixel value`` lines (1-based)."""
    _write_triples(pathlib.Path(path), features)


def write_categories(path, ids):
    """Writes 0-based row ids as a 1-based categories file, one id per line."""
    given = np.asarray(ids).reshape(-1)
    if given.size and (given.dtype.kind not in "iuf" or np.any(given != np.floor(given))):
        # 2.2 became id 3 in the file, a boolean mask a list of 0s and 1s.
        raise invalid_value("ids", "integer 0-based row ids",
                            received=f"ids of dtype {given.dtype}: {given[:5].tolist()}")
    ids = given.astype(np.int64)
    if ids.size and ids.min() < 0:
        raise invalid_value("ids", "non-negative 0-based row ids",
                            received=f"an id {int(ids.min())}")
    np.savetxt(pathlib.Path(path), ids + 1, fmt="%d")


def _write_triples(path, matrix):
    coo = scipy.sparse.coo_matrix(matrix)
    coo.sum_duplicates()  # also sorts row-major
    table = np.column_stack(
        [coo.row.astype(np.float64) + 1, coo.col.astype(np.float64) + 1, coo.data.astype(np.float64)]
    )
    # %.9g prints any float32 exactly (and 1/16 as 0.0625).
    np.savetxt(path, table, fmt=["%d", "%d", "%.9g"], delimiter="\t")


# The largest magnitude a value may have: values are kept in float32.
_FLOAT32_MAX = float(np.finfo(np.float32).max)

# The largest row or image id read: inputs are counted in int32 (and a
# larger id, 1e20 say, asked for a matrix of that many rows).
_MAX_ID = 2**31 - 1


def _read_triples(path, max_row, max_col):
    """Returns 0-based rows, 0-based cols and float32 values of a triple file."""
    max_row = _MAX_ID if max_row is None else max_row
    table = _load_table(path, fields=3, layout=_TRIPLE)
    rows, cols, values = table[:, 0], table[:, 1], table[:, 2]
    problems = (
        (rows < 1) | (cols < 1) | (rows != np.floor(rows)) | (cols != np.floor(cols))
        | ~(np.abs(values) <= _FLOAT32_MAX) | (cols > max_col) | (rows > max_row)
    )
    if problems.any():
        _raise_for_first_bad_line(
            path, fields=3, layout=_TRIPLE,
            check=lambda parts: _triple_problem(parts, max_row, max_col),
        )
    return rows.astype(np.int64) - 1, cols.astype(np.int64) - 1, values.astype(np.float32)


def _to_csr(path, rows, cols, values, shape):
    keys = rows * shape[1] + cols
    order = np.argsort(keys, kind="stable")
    repeated = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if repeated.size:
        index = int(order[repeated + 1].min())
        raise ValueError(
            f"Malformed line {_line_number(path, index)} in '{path}': expected each "
            f"(row, col) once. Received: a repeated entry ({rows[index] + 1}, {cols[index] + 1})."
        )
    return scipy.sparse.csr_matrix((values, (rows, cols)), shape=shape, dtype=np.float32)


def _load_table(path, fields, layout):
    """Parses the file with NumPy's C reader; finds the bad line when that fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Empty input file"
            table = np.loadtxt(path, dtype=np.float64, comments=None, ndmin=2)
    except FileNotFoundError:
        raise FileNotFoundError(f"The challenge file '{path}' does not exist.") from None
    except (OSError, EOFError, UnicodeDecodeError) as error:
        # A truncated or corrupt .gz file, or one that is not text.
        raise ValueError(f"The challenge file '{path}' cannot be read as a text table of "
                         f"numbers ({type(error).__name__}: {error}).") from None
    except ValueError as error:
        _raise_for_first_bad_line(path, fields, layout, check=lambda parts: None, cause=error)
    if table.size == 0:
        return np.zeros((0, fields))
    if table.shape[1] != fields:
        _raise_for_first_bad_line(path, fields, layout, check=lambda parts: None)
    return table


def _raise_for_first_bad_line(path, fields, layout, check, cause=None):
    """Reads the file line by line and raises for the first malformed line."""
    for number, line in _numbered_lines(path):
        parts = line.split()
        if not parts:
            continue
        problem = _fields_problem(parts, fields) or check(parts)
        if problem:
            raise ValueError(
                f"Malformed line {number} in '{path}': expected {layout}{problem}. "
                f"Received: {line.rstrip()!r}"
            ) from cause
    raise ValueError(f"Malformed file '{path}': expected lines of {layout}.") from cause


def _fields_problem(parts, fields):
    if len(parts) != fields:
        return f" ({fields} field{'s' if fields > 1 else ''})"
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        return " (numbers)"
    if not all(np.isfinite(numbers)):
        return " (finite numbers)"
    return None


def _triple_problem(parts, max_row, max_col):
    row, col = float(parts[0]), float(parts[1])
    if row < 1 or col < 1 or row != int(row) or col != int(col):
        return " (row and column integers >= 1)"
    if not abs(float(parts[2])) <= _FLOAT32_MAX:
        return f" (values of magnitude <= {_FLOAT32_MAX:.7g}, finite in float32)"
    if row > max_row:
        return f" (row <= {max_row})"
    if col > max_col:
        return f" (column <= {max_col})"
    return None


def _id_problem(parts):
    value = float(parts[0])
    bad = value < 1 or value > _MAX_ID or value != int(value)
    return f" (an integer in [1, {_MAX_ID}])" if bad else None


def _numbered_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as stream:
        yield from enumerate(stream, start=1)


def _line_number(path, data_index):
    """The 1-based line number of the ``data_index``-th non-blank line."""
    seen = -1
    for number, line in _numbered_lines(path):
        if line.strip():
            seen += 1
            if seen == data_index:
                return number
    return data_index + 1


def _first_existing(candidates):
    for candidate in candidates:
        for path in (candidate, candidate.with_name(candidate.name + ".gz")):
            if path.is_file():
                return path
    raise FileNotFoundError(
        "No challenge weight file found: looked for "
        + ", ".join(f"'{path}'" for path in candidates) + " (or with '.gz')."
    )
