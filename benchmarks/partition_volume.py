"""Communication volume and load imbalance of the partitioning methods.

For k = 2, 4, 8, 16 workers, partitions with "hypergraph" (Mt-KaHyPar),
"graph" (METIS), "block" and "random":

- RadiX-Net 1024 x ``--layers-1024`` and 4096 x ``--layers-4096`` (the Graph
  Challenge generator of ``tfsparse.graphchallenge``), as generated and with
  every neuron renumbered at random;
- pruned MNIST MLPs: 784-256-256-256-10 trained on the shipped MNIST sample,
  every kernel pruned to each density of ``--mlp-densities`` by magnitude,
  with each method of ``--mlp-pruning``: "oneshot" (dense training, one
  pruning step, sparse fine-tuning as SparseDense layers) and "gmp" (gradual
  magnitude pruning during training with tfmot's ``PolynomialDecay``
  schedule, then ``strip_pruning`` and ``tfsparse.sparsify``); their three
  hidden kernels are partitioned (the 10-unit classifier cannot be split
  over 16 workers), and the test accuracy is in the network's name;
- banded networks (neuron j reads the inputs within ``--band`` of j), as
  generated and renumbered at random.

Prints one Markdown table per network (volume in words per sample, ratio to
random, busiest sender, worst layer imbalance, partitioning time) and checks
the targets: hypergraph volume never above the other methods, at most half
of random's on the networks with locality (banded, pruned), imbalance within
epsilon. Where the hypergraph misses half of random, it computes
``volume_lower_bound``: the fewest words any partition within epsilon can
send, which tells whether any partitioner could meet the target there.
Writes a PNG chart per network and a JSON of all rows to ``--out``.

Usage:
    python benchmarks/partition_volume.py [--layers-1024 120] [--layers-4096 24]
        [--only WORD ...] [--preset highest_quality --runs 4 --refine 4]
        [--no-bound]
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402

from tfsparse.partition.compare import compare_methods  # noqa: E402
from tfsparse.partition.compare import format_bounds  # noqa: E402
from tfsparse.partition.compare import format_table  # noqa: E402
from tfsparse.partition.compare import lower_bounds  # noqa: E402
from tfsparse.partition.compare import plot_comparison  # noqa: E402
from tfsparse.partition.networks import banded_network  # noqa: E402
from tfsparse.partition.networks import relabel_neurons  # noqa: E402

KS = (2, 4, 8, 16)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers-1024", type=int, default=120)
    parser.add_argument("--layers-4096", type=int, default=24)
    parser.add_argument("--band-neurons", type=int, default=1024)
    parser.add_argument("--band-layers", type=int, default=16)
    parser.add_argument("--band", type=int, default=16,
                        help="band half-width: 2 * band + 1 inputs per neuron")
    parser.add_argument("--mlp-densities", type=float, nargs="+",
                        default=[0.1, 0.05, 0.02, 0.01])
    parser.add_argument("--mlp-pruning", nargs="+", default=["oneshot", "gmp"],
                        choices=["oneshot", "gmp"])
    parser.add_argument("--preset", default="default",
                        help="Mt-KaHyPar preset of the hypergraph method")
    parser.add_argument("--runs", type=int, default=1,
                        help="hypergraph: Mt-KaHyPar runs per layer, best kept")
    parser.add_argument("--refine", type=int, default=1,
                        help="hypergraph: refinement sweeps")
    parser.add_argument("--epsilon", type=float, default=0.03)
    parser.add_argument("--no-bound", action="store_true",
                        help="skip the lower bounds of the missed targets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only the networks whose name contains one "
                             "of these words")
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path("out/partition_volume"))
    return parser.parse_args(argv)


def pruned_mnist_mlp(density, seed):
    """Trains a dense MLP, prunes each kernel by magnitude, fine-tunes it sparse.

    Returns:
        ``(hidden_kernels, test_accuracy)``: the three hidden kernels (the
        classifier is left out) and the pruned network's test accuracy.
    """
    import tensorflow as tf
    from tfsparse._keras import keras
    from tfsparse.data import load_mnist_sample
    from tfsparse.layers import SparseDense

    tf.random.set_seed(seed)
    (x_train, y_train), (x_test, y_test) = load_mnist_sample(seed=seed)
    x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
    x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
    widths = (256, 256, 256)
    dense = keras.Sequential(
        [keras.Input((784,))]
        + [keras.layers.Dense(w, activation="relu") for w in widths]
        + [keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    dense.compile("adam", loss, metrics=["accuracy"])
    dense.fit(x_train, y_train, epochs=8, batch_size=64, verbose=0)
    patterns = []
    for layer in dense.layers:
        kernel, bias = layer.get_weights()
        keep = max(1, int(round(density * kernel.size)))
        threshold = np.sort(np.abs(kernel).ravel())[-keep]
        patterns.append((scipy.sparse.csr_matrix(
            np.where(np.abs(kernel) >= threshold, kernel, 0.0)), bias))
    sparse = keras.Sequential(
        [keras.Input((784,))]
        + [SparseDense(w, pattern=p, activation="relu")
           for w, (p, _) in zip(widths, patterns)]
        + [SparseDense(10, pattern=patterns[-1][0])])
    for layer, (_, bias) in zip(sparse.layers, patterns):
        layer.bias.assign(bias)
    sparse.compile("adam", loss, metrics=["accuracy"])
    sparse.fit(x_train, y_train, epochs=4, batch_size=64, verbose=0)
    accuracy = sparse.evaluate(x_test, y_test, verbose=0)[1]
    return [layer.to_scipy() for layer in sparse.layers[:3]], accuracy


def gmp_mnist_mlp(density, seed):
    """Prunes an MLP gradually while training it, the tfmot way.

    2 dense epochs, then tfmot's ``PolynomialDecay`` from sparsity 0 to
    ``1 - density`` over 8 epochs (masks updated 4 times per epoch), then 4
    epochs at that sparsity; ``strip_pruning`` and ``tfsparse.sparsify``.

    Returns:
        ``(hidden_kernels, test_accuracy)`` as ``pruned_mnist_mlp``.
    """
    import tensorflow as tf
    import tensorflow_model_optimization as tfmot
    from tfsparse._keras import keras
    from tfsparse.data import load_mnist_sample
    from tfsparse.layers import sparsify

    tf.random.set_seed(seed)
    (x_train, y_train), (x_test, y_test) = load_mnist_sample(seed=seed)
    x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
    x_test = x_test.reshape(-1, 784).astype("float32") / 255.0
    model = keras.Sequential(
        [keras.Input((784,))]
        + [keras.layers.Dense(w, activation="relu") for w in (256, 256, 256)]
        + [keras.layers.Dense(10)])
    steps = int(np.ceil(len(x_train) / 64))
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=0.0, final_sparsity=1.0 - density,
        begin_step=2 * steps, end_step=10 * steps, frequency=steps // 4)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(
        model, pruning_schedule=schedule)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    pruned.compile("adam", loss, metrics=["accuracy"])
    pruned.fit(x_train, y_train, epochs=14, batch_size=64, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    sparse = sparsify(tfmot.sparsity.keras.strip_pruning(pruned))
    sparse.compile("adam", loss, metrics=["accuracy"])
    accuracy = sparse.evaluate(x_test, y_test, verbose=0)[1]
    return [layer.to_scipy() for layer in sparse.layers[:3]], accuracy


def networks(args):
    """Yields ``(name, has_locality, kernels)`` of the networks ``--only`` keeps."""
    from tfsparse.graphchallenge import radixnet

    def wanted(name):
        return not args.only or any(word in name for word in args.only)

    for neurons, layers in ((1024, args.layers_1024), (4096, args.layers_4096)):
        kernels = radixnet(neurons, layers, seed=args.seed)
        yield f"RadiX-Net {neurons}x{layers}", False, kernels
        yield (f"RadiX-Net {neurons}x{layers} relabelled", False,
               relabel_neurons(kernels, seed=args.seed + 1)[0])
    for pruning in args.mlp_pruning:
        for density in args.mlp_densities:
            name = (f"pruned MNIST MLP 784-256-256-256 {pruning} density "
                    f"{density}")
            if not wanted(name):
                continue
            train = gmp_mnist_mlp if pruning == "gmp" else pruned_mnist_mlp
            kernels, accuracy = train(density, args.seed)
            name += f" (test accuracy {accuracy:.3f})"
            yield name, True, kernels
            yield (name + " relabelled", True,
                   relabel_neurons(kernels, args.seed + 1)[0])
    band = banded_network(args.band_neurons, args.band_layers, args.band,
                          seed=args.seed)
    name = (f"banded {args.band_neurons}x{args.band_layers} "
            f"window {2 * args.band + 1}")
    yield name, True, band
    yield name + " relabelled", True, relabel_neurons(band, args.seed + 1)[0]


def misses_half_of_random(has_locality, rows, k):
    """Whether the hypergraph volume at ``k`` is above half of random's."""
    by = {r["method"]: r["volume"] for r in rows if r["k"] == k}
    return has_locality and by["hypergraph"] > 0.5 * by["random"]


def add_lower_bounds(kernels, has_locality, rows, epsilon):
    """Adds ``lower_bound`` to the hypergraph rows that miss half of random.

    Returns a Markdown table of those bounds, or "" when every row meets it.
    """
    missed = [k for k in sorted({r["k"] for r in rows})
              if misses_half_of_random(has_locality, rows, k)]
    if not missed:
        return ""
    bounds = lower_bounds(kernels, missed, epsilon)
    for bound in bounds:
        next(r for r in rows if r["k"] == bound["k"]
             and r["method"] == "hypergraph")["lower_bound"] = \
            bound["lower_bound"]
    return format_bounds(bounds, rows)


def check_targets(name, has_locality, rows, epsilon):
    """Returns the failed target checks of one network, as text lines."""
    failures = []
    for k in sorted({r["k"] for r in rows}):
        by = {r["method"]: r for r in rows if r["k"] == k}
        hyper = by["hypergraph"]
        for method in ("graph", "block", "random"):
            if hyper["volume"] > by[method]["volume"]:
                failures.append(f"{name}, k={k}: hypergraph {hyper['volume']} "
                                f"> {method} {by[method]['volume']}")
        if misses_half_of_random(has_locality, rows, k):
            half = 0.5 * by["random"]["volume"]
            line = (f"{name}, k={k}: hypergraph {hyper['volume']} > half of "
                    f"random {by['random']['volume']}")
            if "lower_bound" in hyper:
                verdict = ("no partition within epsilon can meet it"
                           if hyper["lower_bound"] > half else
                           "the bound does not rule it out")
                line += (f" ({verdict}: lower bound {hyper['lower_bound']}, "
                         f"{hyper['lower_bound'] / by['random']['volume']:.3f}"
                         " of random)")
            failures.append(line)
        if hyper["imbalance"] > epsilon + 1e-12:
            failures.append(f"{name}, k={k}: hypergraph imbalance "
                            f"{hyper['imbalance']:.4f} > {epsilon}")
    return failures


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failures, results = [], []
    start = time.perf_counter()
    for index, (name, has_locality, kernels) in enumerate(networks(args)):
        if args.only and not any(word in name for word in args.only):
            continue
        edges = sum(kernel.nnz for kernel in kernels)
        print(f"\n### {name}: {len(kernels)} layers, {edges} edges", flush=True)
        rows = compare_methods(kernels, KS, epsilon=args.epsilon,
                               seed=args.seed, progress=True, preset=args.preset,
                               runs=args.runs, refine=args.refine)
        print(format_table(rows), flush=True)
        if not args.no_bound:
            bounds = add_lower_bounds(kernels, has_locality, rows,
                                      args.epsilon)
            if bounds:
                print("\n" + bounds, flush=True)
        plot_comparison(rows, args.out / f"network{index}.png", title=name,
                        epsilon=args.epsilon)
        failures += check_targets(name, has_locality, rows, args.epsilon)
        results += [{key: value for key, value in r.items()
                     if key != "partition"} | {"network": name}
                    for r in rows]
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\ntotal time {time.perf_counter() - start:.0f} s; "
          f"charts and results.json in {args.out}")
    print("targets:", "all met" if not failures else "NOT met:")
    for line in failures:
        print("  " + line)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
