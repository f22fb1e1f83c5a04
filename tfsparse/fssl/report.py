"""report(): a per-layer table of what compaction removes and what it saves."""

from tfsparse.fssl import functional
from tfsparse.fssl.compact import DEFAULT_DENSE_THRESHOLD
from tfsparse.fssl.compact import plan
from tfsparse.fssl.compact import uses_chain_path
from tfsparse.layers import SparseDense

_COLUMNS = (
    ("layer", "layer"), ("type", "type"), ("shape before", "shape_before"),
    ("shape after", "shape_after"), ("nnz before", "nnz_before"), ("nnz after", "nnz_after"),
    ("MACs/sample before", "macs_before"), ("MACs/sample after", "macs_after"),
    ("nnz removed", "nnz_removed"), ("MACs removed", "macs_removed"),
)


def _share_removed(before, after):
    if before is None or after is None:
        return None
    return 1.0 - after / before if before else 0.0


def _total(rows, key):
    """The sum of the rows' ``key``, or None when one of them is unknown."""
    values = [row[key] for row in rows]
    return None if None in values else sum(values)


def _macs(is_dense, shape, nnz):
    """Multiply-adds per sample: every entry of a Dense kernel, the nonzeros of a sparse one."""
    return shape[0] * shape[1] if is_dense else nnz


def report(model, dense_threshold=DEFAULT_DENSE_THRESHOLD, print_fn=print):
    """Prints and returns, per layer, what ``compact(model, dense_threshold)`` would do.

    For a functional model (or a Sequential one beyond a Dense/SparseDense
    chain) the rows cover its Dense, SparseDense and convolution layers: a
    convolution's shapes are its kernel's ``(*spatial, in, filters)``, its
    multiply-adds per sample every kernel entry at every output position
    (a dense convolution multiplies zeros too). Layers left intact (see
    :func:`tfsparse.fssl.compact`) are named under the table.

    Args:
        model: a model that :func:`tfsparse.fssl.compact` accepts.
        dense_threshold: as in :func:`tfsparse.fssl.compact`.
        print_fn: called with the formatted table (a str); None prints nothing.

    Returns:
        A list with one dict per Dense/SparseDense/convolution layer and a last ``"total"``
        one, with keys ``layer``, ``type`` (before -> after), ``shape_before``,
        ``shape_after`` (over the kept inputs and units: a first layer that
        stays SparseDense is built with the original input width, but its
        pattern has no nonzero in the removed inputs' rows and never reads
        them), ``nnz_before`` (nonzeros of a Dense kernel, stored
        values of a SparseDense), ``nnz_after``, ``macs_before``,
        ``macs_after`` (multiply-adds per sample: every kernel entry of a Dense
        layer, the stored values of a SparseDense; None for a convolution
        whose output size is not fixed, and then for the total), ``nnz_removed``
        and ``macs_removed`` (the shares removed, ``1 - after / before``). A
        SparseDense that becomes Dense can do more multiply-adds (a negative
        share), but dense ones, which run faster per multiply-add above the
        density crossover.

    Example:
        >>> from tfsparse._keras import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> rows = report(model, print_fn=None)
        >>> rows[0]["macs_before"], rows[0]["macs_removed"]
        (12, 0.0)
    """
    intact = []
    if uses_chain_path(model):
        rows = _chain_rows(model, dense_threshold)
    else:
        rows, intact = functional.report_rows(model, dense_threshold)
    total_before, total_after = _total(rows, "macs_before"), _total(rows, "macs_after")
    rows.append({
        "layer": "total", "type": "", "shape_before": "", "shape_after": "",
        "nnz_before": sum(row["nnz_before"] for row in rows),
        "nnz_after": sum(row["nnz_after"] for row in rows),
        "macs_before": total_before, "macs_after": total_after,
    })
    for row in rows:
        row["nnz_removed"] = _share_removed(row["nnz_before"], row["nnz_after"])
        row["macs_removed"] = _share_removed(row["macs_before"], row["macs_after"])
    if print_fn is not None:
        table = format_table(rows)
        if intact:
            table += "\nleft intact, every channel around them kept: " + ", ".join(intact)
        print_fn(table)
    return rows


def _chain_rows(model, dense_threshold):
    rows = []
    for layer_plan in plan(model, dense_threshold):
        layer = layer_plan.layer
        before_dense = not isinstance(layer, SparseDense)
        shape_before = layer_plan.original_shape
        shape_after = layer_plan.kernel.shape
        # A SparseDense multiplies all its stored values, masked zeros included.
        nnz_before = int((layer.kernel.numpy() != 0).sum()) if before_dense else layer.nnz
        nnz_after = int(layer_plan.kernel.nnz)
        macs_before = _macs(before_dense, shape_before, nnz_before)
        macs_after = _macs(layer_plan.to_dense, shape_after, nnz_after)
        after_type = "Dense" if layer_plan.to_dense else "SparseDense"
        rows.append({
            "layer": layer.name,
            "type": f"{type(layer).__name__} -> {after_type}",
            "shape_before": tuple(shape_before),
            "shape_after": tuple(shape_after),
            "nnz_before": nnz_before,
            "nnz_after": nnz_after,
            "macs_before": macs_before,
            "macs_after": macs_after,
        })
    return rows


def format_table(rows):
    """The rows of :func:`report` as an aligned text table."""
    def cell(key, value):
        if value is None:
            return "?"
        if key.endswith("removed"):
            return f"{100 * value:.1f}%"
        if isinstance(value, tuple):
            return "x".join(str(v) for v in value)
        return str(value)

    table = [[title for title, _ in _COLUMNS]]
    table += [[cell(key, row[key]) for _, key in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(text.ljust(width) if i < 2 else text.rjust(width)
                       for i, (text, width) in enumerate(zip(line, widths)))
             for line in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
