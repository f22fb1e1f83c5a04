"""Side-by-side comparison of the partitioning methods: table and bar chart."""

import time

from tqdm.auto import tqdm

from tfsparse.partition.bound import volume_lower_bound
from tfsparse.partition.rows import METHODS
from tfsparse.partition.rows import partition_rows


def compare_methods(kernels, ks, methods=METHODS, epsilon=0.03, seed=0,
                    progress=False, **options):
    """Partitions ``kernels`` with every method for every ``k``.

    Args:
        kernels: list of kernels ``(n_{l-1}, n_l)`` or a SparseDense model.
        ks: iterable of worker counts.
        methods: methods to run (see ``partition_rows``).
        epsilon: allowed load imbalance.
        seed: partitioner seed.
        progress: show a progress bar over the runs.
        **options: further ``partition_rows`` keyword arguments.

    Returns:
        A list of dicts with keys ``k``, ``method``, ``volume``,
        ``max_volume``, ``imbalance``, ``seconds`` and ``partition``.

    Example:
        >>> import scipy.sparse
        >>> w = [scipy.sparse.eye(8, format="csr")] * 2
        >>> [r["volume"] for r in compare_methods(w, [2], ["block"])]
        [0]
    """
    runs = [(k, method) for k in ks for method in methods]
    rows = []
    for k, method in tqdm(runs, desc="partitions", disable=not progress):
        part = partition_rows(kernels, k, method, epsilon, seed, **options)
        rows.append({"k": k, "method": method, "volume": part.volume,
                     "max_volume": part.max_volume,
                     "imbalance": part.imbalance, "seconds": part.seconds,
                     "partition": part})
    return rows


def format_table(rows):
    """Returns a Markdown table of ``compare_methods`` rows.

    The ``vs random`` column is each volume divided by random's for the same
    ``k`` (when random was run).
    """
    random_volume = {r["k"]: r["volume"] for r in rows
                     if r["method"] == "random"}
    lines = ["| k | method | volume (words/sample) | vs random | max volume "
             "| imbalance | time (s) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = random_volume.get(r["k"])
        ratio = f"{r['volume'] / base:.3f}" if base else "-"
        lines.append(f"| {r['k']} | {r['method']} | {r['volume']} | {ratio} "
                     f"| {r['max_volume']} | {r['imbalance']:.4f} "
                     f"| {r['seconds']:.2f} |")
    return "\n".join(lines)


def lower_bounds(kernels, ks, epsilon=0.03, progress=False):
    """The fewest words any partition within ``epsilon`` sends, for each k.

    Args:
        kernels: list of kernels ``(n_{l-1}, n_l)`` or a SparseDense model.
        ks: iterable of worker counts.
        epsilon: allowed load imbalance.
        progress: show a progress bar over the ``k``.

    Returns:
        A list of dicts with keys ``k``, ``lower_bound`` (the network's
        ``volume_lower_bound``, summed over layers) and ``seconds``.

    Example:
        >>> import numpy as np
        >>> lower_bounds([np.ones((3, 4))], [2])[0]["lower_bound"]
        3
    """
    bounds = []
    for k in tqdm(list(ks), desc="lower bounds", disable=not progress):
        start = time.perf_counter()
        bound = int(volume_lower_bound(kernels, k, epsilon).sum())
        bounds.append({"k": k, "lower_bound": bound,
                       "seconds": time.perf_counter() - start})
    return bounds


def format_bounds(bounds, rows):
    """Returns a Markdown table of ``lower_bounds`` next to ``compare_methods`` rows.

    Columns: the bound, its ratio to random's volume and each method's
    volume over the bound (how far it can be from the best partition).
    """
    volume = {(r["k"], r["method"]): r["volume"] for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = ["| k | lower bound (words/sample) | vs random | "
             + " | ".join(f"{m} / bound" for m in methods) + " | time (s) |",
             "|---:|---:|---:|" + "---:|" * len(methods) + "---:|"]
    for b in bounds:
        k, bound = b["k"], b["lower_bound"]
        base = volume.get((k, "random"))
        ratio = f"{bound / base:.3f}" if base else "-"
        over = [f"{volume[(k, m)] / bound:.2f}" if bound and (k, m) in volume
                else "-" for m in methods]
        lines.append(f"| {k} | {bound} | {ratio} | " + " | ".join(over)
                     + f" | {b['seconds']:.1f} |")
    return "\n".join(lines)


def plot_comparison(rows, path, title="", epsilon=None):
    """Writes a PNG bar chart: volume and imbalance per method, grouped by k.

    Args:
        rows: ``compare_methods`` rows.
        path: the PNG file to write.
        title: figure title.
        epsilon: draws the allowed imbalance as a line when given.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ks = sorted({r["k"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    table = {(r["k"], r["method"]): r for r in rows}
    width = 0.8 / len(methods)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, method in enumerate(methods):
        x = np.arange(len(ks)) + (index - (len(methods) - 1) / 2) * width
        for axis, key in zip(axes, ("volume", "imbalance")):
            values = [table[(k, method)][key] if (k, method) in table else 0
                      for k in ks]
            axis.bar(x, values, width, label=method)
    for axis, label in zip(axes, ("words sent per sample (log)",
                                  "load imbalance (max/mean - 1)")):
        axis.set_xticks(np.arange(len(ks)), [f"k={k}" for k in ks])
        axis.set_ylabel(label)
    axes[0].set_yscale("symlog", linthresh=1.0)
    if epsilon is not None:
        axes[1].axhline(epsilon, color="black", linestyle="--",
                        label=f"epsilon={epsilon}")
    axes[1].legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
