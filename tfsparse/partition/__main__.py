"""``python -m tfsparse.partition``: compare the partitioning methods on a network.

Partitions a generated Graph Challenge network (RadiX-Net, ``--neurons``,
``--layers``) or the SparseDense layers of a saved Keras model (``--model``) into
``k`` parts with every method, prints a Markdown table (volume in words per
sample, ratio to random, busiest sender, load imbalance, time) and writes a
PNG bar chart of volume and imbalance per method. ``--bound`` adds the fewest
words any partition within epsilon can send (``volume_lower_bound``), to tell
how far each method can be from the best partition.

Example:
    python -m tfsparse.partition --neurons 1024 --layers 12 -k 2 4 8 16
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfsparse._validation import invalid_value  # noqa: E402
from tfsparse.partition.compare import compare_methods  # noqa: E402
from tfsparse.partition.compare import format_bounds  # noqa: E402
from tfsparse.partition.compare import format_table  # noqa: E402
from tfsparse.partition.compare import lower_bounds  # noqa: E402
from tfsparse.partition.compare import plot_comparison  # noqa: E402
from tfsparse.partition.networks import relabel_neurons  # noqa: E402
from tfsparse.partition.rows import METHODS  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m tfsparse.partition",
        description="Communication volume and load imbalance of each "
                    "partitioning method on a sparse network.")
    parser.add_argument("--model", type=pathlib.Path, default=None,
                        help="saved Keras model of SparseDense layers "
                             "(default: a generated RadiX-Net)")
    parser.add_argument("--neurons", type=int, default=1024,
                        help="RadiX-Net neurons per layer (default 1024)")
    parser.add_argument("--layers", type=int, default=120,
                        help="RadiX-Net layers (default 120)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the network, relabelling and partitioners")
    parser.add_argument("-k", type=int, nargs="+", default=[2, 4, 8, 16],
                        help="worker counts (default 2 4 8 16)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        choices=METHODS, help="methods to compare")
    parser.add_argument("--epsilon", type=float, default=0.03,
                        help="allowed load imbalance (default 0.03)")
    parser.add_argument("--relabel", action="store_true",
                        help="renumber the neurons at random first")
    parser.add_argument("--refine", type=int, default=1,
                        help="hypergraph refinement sweeps (default 1)")
    parser.add_argument("--threads", type=int, default=2,
                        help="Mt-KaHyPar threads (default 2)")
    parser.add_argument("--plot", type=pathlib.Path,
                        default=pathlib.Path("partition_comparison.png"),
                        help="PNG bar chart to write (default: partition_comparison.png "
                        "in the current directory)")
    parser.add_argument("--save-dir", type=pathlib.Path, default=None,
                        help="also save every partition there as .npz")
    parser.add_argument("--bound", action="store_true",
                        help="also compute the volume lower bound of any "
                             "partition within epsilon (slow on large layers)")
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress bar")
    args = parser.parse_args(argv)
    for name in ("neurons", "layers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, "
                         f"got {getattr(args, name)}")
    # Before the partitions are computed, not after (a traceback from PIL
    # or Keras at the end of the run).
    if args.model is not None and not args.model.exists():
        parser.error(f"--model {args.model} does not exist")
    if not args.plot.parent.is_dir():
        parser.error(f"--plot {args.plot}: no directory {args.plot.parent}")
    return args


def load_kernels(args):
    """Returns ``(kernels, description)`` for the network the arguments name.

    From a saved model: its first run of SparseDense layers (layers without
    weights, such as Dropout, may sit between them); layers with weights
    after it, such as a Dense classifier, are left out and named.
    """
    if args.model is not None:
        from tfsparse._keras import keras
        from tfsparse.layers import SparseDense
        model = keras.models.load_model(args.model, compile=False)
        weighted = [layer for layer in model.layers if layer.weights]
        run = []
        for layer in weighted:
            if isinstance(layer, SparseDense):
                run.append(layer)
            elif run:
                break
        if not run:
            raise invalid_value(
                "--model", "a saved model with SparseDense layers",
                received=f"{args.model} (layers with weights: "
                f"{', '.join(type(l).__name__ for l in weighted) or 'none'})")
        description = (f"model {args.model.name}, SparseDense layers "
                       f"{', '.join(layer.name for layer in run)}")
        left_out = [layer.name for layer in weighted if layer not in run]
        if left_out:
            description += f" (left out: {', '.join(left_out)})"
        return [layer.to_scipy() for layer in run], description
    from tfsparse.graphchallenge import radixnet
    kernels = radixnet(args.neurons, args.layers, seed=args.seed)
    return kernels, f"RadiX-Net {args.neurons}x{args.layers}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        kernels, description = load_kernels(args)
        if args.relabel:
            kernels, _ = relabel_neurons(kernels, seed=args.seed)
            description += ", relabelled at random"
        rows = compare_methods(kernels, args.k, args.methods, args.epsilon,
                               args.seed, progress=not args.no_progress,
                               refine=args.refine, threads=args.threads)
        bounds = (lower_bounds(kernels, args.k, args.epsilon,
                               progress=not args.no_progress)
                  if args.bound else None)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{description}: {sum(k.nnz for k in kernels)} edges, "
          f"epsilon={args.epsilon}")
    print(format_table(rows))
    if bounds is not None:
        print("\nAny partition within epsilon sends at least:")
        print(format_bounds(bounds, rows))
    plot_comparison(rows, args.plot, title=description, epsilon=args.epsilon)
    print(f"chart: {args.plot}")
    if args.save_dir is not None:
        args.save_dir.mkdir(parents=True, exist_ok=True)
        for row in rows:
            row["partition"].save(
                args.save_dir / f"partition-{row['method']}-k{row['k']}.npz")
        print(f"partitions: {args.save_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
