"""SparsityPattern: the fixed positions of a sparse kernel's nonzeros."""

import numpy as np
import scipy.sparse

from tfsparse._validation import check_fraction
from tfsparse._validation import check_non_negative_int
from tfsparse._validation import invalid_value

# Indices are int32 (the kernels' and TensorFlow's sparse ops').
_MAX_EXTENT = np.iinfo(np.int32).max


def _check_shape(shape):
    """``(input_dim, units)`` as ints: positive integers that fit int32 indices."""
    try:
        extents = tuple(shape)
    except TypeError:
        extents = None
    if (extents is None or isinstance(shape, str) or len(extents) != 2
            or not all(isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_))
                       and 0 < e <= _MAX_EXTENT for e in extents)):
        raise invalid_value("shape", f"(input_dim, units) of positive integers up to "
                            f"{_MAX_EXTENT}", shape)
    return tuple(int(e) for e in extents)


def scipy_values(values):
    """``values`` as an array scipy.sparse holds: float16 and bfloat16 (which
    it does not) as float32, exactly; other dtypes as they are.

    Example:
      >>> scipy_values(np.ones(2, np.float16)).dtype.name
      'float32'
    """
    values = np.asarray(values)
    if values.dtype.name in ("float16", "bfloat16"):
        return values.astype(np.float32)
    return values


class SparsityPattern:
    """The nonzero positions of a kernel ``W`` of shape ``(input_dim, units)``.

    ``y = x @ W`` as in Keras' ``Dense``. The nonzeros are kept in column-major
    order (by output unit, then input), which is the order of the values vector
    of a ``SparseDense`` layer. ``row_major_order`` is the permutation that
    sorts them by input instead (used by the backward pass).

    Args:
      rows: 1-D integer array, the input index of each nonzero.
      cols: 1-D integer array, the output index of each nonzero.
      shape: ``(input_dim, units)``.

    Example:
      >>> import scipy.sparse
      >>> pattern, values = SparsityPattern.from_scipy(
      ...     scipy.sparse.eye(3, 4, format="csr"))
      >>> pattern.nnz, pattern.shape
      (3, (3, 4))
    """

    def __init__(self, rows, cols, shape):
        shape = _check_shape(shape)
        rows = np.asarray(rows)
        cols = np.asarray(cols)
        if rows.ndim != 1 or cols.ndim != 1 or rows.shape != cols.shape:
            raise invalid_value(
                "rows",
                "1-D index arrays rows and cols of equal length",
                received=f"rows of shape {rows.shape} and cols of shape {cols.shape}",
            )
        for name, array in (("rows", rows), ("cols", cols)):
            # 0.9 was truncated to 0 and NaN became -2**31.
            if array.size and not np.issubdtype(array.dtype, np.integer):
                raise invalid_value(name, "integer indices",
                                    received=f"{name} of dtype {array.dtype}")
        if rows.size and (rows.min() < 0 or rows.max() >= shape[0]):
            raise invalid_value("rows", f"indices in [0, {shape[0]})",
                                received=f"rows in [{rows.min()}, {rows.max()}]")
        if cols.size and (cols.min() < 0 or cols.max() >= shape[1]):
            raise invalid_value("cols", f"indices in [0, {shape[1]})",
                                received=f"cols in [{cols.min()}, {cols.max()}]")
        key = cols.astype(np.int64) * shape[0] + rows.astype(np.int64)
        if key.size > 1 and not np.all(key[1:] > key[:-1]):
            repeated = np.flatnonzero(np.diff(np.sort(key)) == 0)
            if repeated.size:  # from_coo sorts, but cannot choose between repeats
                k = int(np.sort(key)[repeated[0]])
                raise invalid_value(
                    "rows", "unique (row, col) positions",
                    received=f"position ({k % shape[0]}, {k // shape[0]}) more than once")
            raise invalid_value(
                "rows",
                "unique nonzeros sorted by column then row "
                "(use SparsityPattern.from_coo to sort)",
                received="unsorted positions")
        self.shape = shape
        self.rows = rows.astype(np.int32)
        self.cols = cols.astype(np.int32)
        # By row, then column: the positions are unique, so sorting their
        # row-major keys gives the one such order (twice as fast as lexsort).
        row_major_keys = self.rows.astype(np.int64) * shape[1] + self.cols
        self.row_major_order = np.argsort(row_major_keys).astype(np.int32)
        for array in (self.rows, self.cols, self.row_major_order):
            array.flags.writeable = False

    @property
    def nnz(self):
        """The number of nonzeros."""
        return int(self.rows.size)

    @property
    def density(self):
        """``nnz / (input_dim * units)``."""
        return self.nnz / (self.shape[0] * self.shape[1])

    @classmethod
    def from_coo(cls, rows, cols, shape):
        """A pattern from unsorted, unique (row, col) positions."""
        rows = np.asarray(rows)
        cols = np.asarray(cols)
        if rows.ndim != 1 or rows.shape != cols.shape:
            raise invalid_value(
                "rows", "1-D index arrays rows and cols of equal length",
                received=f"rows of shape {rows.shape} and cols of shape {cols.shape}")
        order = np.lexsort((rows, cols))
        return cls(rows[order], cols[order], shape)

    @classmethod
    def from_scipy(cls, matrix):
        """Returns ``(pattern, values)`` of a ``scipy.sparse`` matrix.

        The pattern holds the positions of the nonzero entries (explicitly
        stored zeros are dropped); ``values`` are those entries in pattern
        order.
        """
        if not scipy.sparse.issparse(matrix):
            raise invalid_value("matrix", "a scipy.sparse matrix",
                                received=f"matrix of type {type(matrix).__name__}")
        csc = scipy.sparse.csc_matrix(matrix, copy=True)
        csc.sum_duplicates()
        csc.eliminate_zeros()
        csc.sort_indices()
        cols = np.repeat(np.arange(csc.shape[1]), np.diff(csc.indptr))
        return cls(csc.indices, cols, csc.shape), np.asarray(csc.data)

    @classmethod
    def random(cls, shape, density, seed=0):
        """A random pattern with the same fan-in for every output unit.

        Every column (output unit) gets ``max(1, round(density * input_dim))``
        distinct inputs drawn uniformly, so the pattern's density is
        ``density`` up to that rounding. Memory is proportional to the number
        of nonzeros, never to ``input_dim * units``.
        """
        input_dim, units = _check_shape(shape)
        density = check_fraction("density", density)
        seed = check_non_negative_int("seed", seed)
        fan_in = max(1, int(round(density * input_dim)))
        rng = np.random.default_rng(seed)
        if 4 * fan_in <= input_dim:
            rows = _distinct_sparse_draws(rng, input_dim, units, fan_in)
        else:
            rows = _distinct_dense_draws(rng, input_dim, units, fan_in)
        cols = np.repeat(np.arange(units), fan_in)
        return cls(rows.ravel(), cols, (input_dim, units))

    def to_scipy(self, values=None):
        """The kernel as a ``scipy.sparse.csr_matrix`` (values 1 if None).

        float16 and bfloat16 values, which scipy.sparse does not hold, come
        out as float32 (exactly).
        """
        if values is None:
            values = np.ones(self.nnz, np.float32)
        if np.shape(values) != (self.nnz,):
            raise invalid_value("values", f"one value per nonzero, shape ({self.nnz},)",
                                received=f"values of shape {np.shape(values)}")
        return scipy.sparse.csr_matrix((scipy_values(values), (self.rows, self.cols)),
                                       shape=self.shape)

    def __eq__(self, other):
        return (
            isinstance(other, SparsityPattern)
            and self.shape == other.shape
            and np.array_equal(self.rows, other.rows)
            and np.array_equal(self.cols, other.cols)
        )

    def __repr__(self):
        return (
            f"SparsityPattern(shape={self.shape}, nnz={self.nnz}, "
            f"density={self.density:.4g})"
        )


def _distinct_sparse_draws(rng, population, count, size):
    """``count`` sorted rows of ``size`` distinct draws from ``population``."""
    draws = np.sort(rng.integers(0, population, size=(count, size)), axis=1)
    while True:
        repeated = np.zeros(draws.shape, bool)
        repeated[:, 1:] = draws[:, 1:] == draws[:, :-1]
        if not repeated.any():
            return draws
        draws[repeated] = rng.integers(0, population, size=int(repeated.sum()))
        draws.sort(axis=1)


def _distinct_dense_draws(rng, population, count, size, chunk_elements=1 << 24):
    chunk = max(1, chunk_elements // population)
    parts = []
    for start in range(0, count, chunk):
        keys = rng.random((min(chunk, count - start), population))
        parts.append(np.sort(np.argpartition(keys, size - 1, axis=1)[:, :size], axis=1))
    return np.concatenate(parts)
