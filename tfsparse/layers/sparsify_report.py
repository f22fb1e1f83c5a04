"""SparsifyReport: what sparsify() converted, and why it left the other layers dense."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SparsifyRow:
    """One kernel layer of the model given to ``sparsify``.

    Attributes:
      name: the layer's name (``outer/inner`` inside a nested model).
      kind: its class name before conversion (``"Conv2D"``, ``"Dense"``, ...).
      shape: its kernel's shape (``(kh, kw, cin, filters)`` or ``(in, units)``).
      density: the kernel's fraction of nonzeros (None for a layer with no one kernel).
      converted: whether it became a ``SparseConv2D`` / ``SparseDense``.
      reason: why (the rule it met) or why not.
    """

    name: str
    kind: str
    shape: tuple
    density: object
    converted: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class SparsifyReport:
    """The per-layer rows of one ``sparsify(model, report=True)`` call.

    ``str(report)`` is a readable table.

    Example:
      >>> row = SparsifyRow("conv", "Conv2D", (3, 3, 8, 8), 0.02, True,
      ...                   "density 0.020 <= max_density 0.030")
      >>> report = SparsifyReport((row,))
      >>> report.converted
      ('conv',)
      >>> print(report)
      layer  kind    kernel shape  density  converted  reason
      -----------------------------------------------------------------------------------
      conv   Conv2D  3x3x8x8         0.020  yes        density 0.020 <= max_density 0.030
    """

    rows: tuple

    @property
    def converted(self):
        """Names of the converted layers."""
        return tuple(row.name for row in self.rows if row.converted)

    @property
    def left_dense(self):
        """``{name: reason}`` of the kernel layers that were not converted."""
        return {row.name: row.reason for row in self.rows if not row.converted}

    def __getitem__(self, name):
        """The row of the layer called ``name``."""
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no layer {name!r} in the report; layers: "
                       f"{', '.join(row.name for row in self.rows)}")

    def __str__(self):
        header = ("layer", "kind", "kernel shape", "density", "converted", "reason")
        lines = [header] + [(
            row.name, row.kind, "x".join(str(size) for size in row.shape),
            "-" if row.density is None else f"{row.density:.3f}",
            "yes" if row.converted else "no", row.reason) for row in self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = ["  ".join(cell.rjust(width) if i == 3 else cell.ljust(width)
                          for i, (cell, width) in enumerate(zip(line, widths))).rstrip()
                for line in lines]
        text.insert(1, "-" * max(len(line) for line in text))
        return "\n".join(text)
