"""Accuracy of dynamic sparse training on MNIST: dense, static, SET, RigL, tfmot pruning.

    python benchmarks/dynamic_sparsity_accuracy.py [--epochs 20] [--seeds 0 1 2]
        [--sparsities 0.9 0.98] [--widths 1024 1024] [--distribution uniform|erk]
        [--plot accuracy.png]

An MLP 784-1024-1024-10 on the shipped MNIST sample (4,000 training and
1,000 test images), the same epochs, batch size, optimizer (Adam 1e-3) and
seeds for every method, in one process:

* dense: ``keras.layers.Dense`` layers;
* static: SparseDense layers with a random pattern kept fixed, every layer at
  the same density (``--distribution uniform``) or at RigL's
  Erdos-Renyi-Kernel densities (``erk``) of the same global sparsity;
* SET and RigL: the same start, moved by ``callbacks.DynamicSparsity``
  (drop fraction 0.3, cosine decay, updates every ``--update-every`` steps
  until 75% of training);
* tfmot: Dense layers pruned by magnitude with tfmot's ``PolynomialDecay``
  from 0 to the same final sparsity at 75% of training.

Prints the test accuracy (mean and spread over the seeds) per method and
sparsity, RigL's gap to dense and to static, and writes a PNG plot.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from callbacks import DynamicSparsity  # noqa: E402
from dynamic_common import compile_for_mnist  # noqa: E402
from dynamic_common import dense_mlp  # noqa: E402
from dynamic_common import mnist  # noqa: E402
from dynamic_common import platform_line  # noqa: E402
from dynamic_common import sparse_mlp  # noqa: E402

METHODS = ("static", "set", "rigl", "tfmot")


def train(method, sparsity, seed, data, args):
    (x, y), (x_test, y_test) = data
    steps = args.epochs * int(np.ceil(len(x) / args.batch_size))
    callbacks = []
    if method == "dense":
        model = dense_mlp(args.widths, seed)
    elif method == "tfmot":
        return train_tfmot(sparsity, seed, data, args, steps)
    else:
        model = sparse_mlp(args.widths, 1 - sparsity, seed, args.distribution)
        if method in ("set", "rigl"):
            callbacks.append(DynamicSparsity(
                method, update_every=args.update_every, drop_fraction=0.3,
                end_step=0.75, seed=seed))
    compile_for_mnist(model)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              callbacks=callbacks, shuffle=True)
    return model.evaluate(x_test, y_test, verbose=0)[1]


def train_tfmot(sparsity, seed, data, args, steps):
    import tensorflow_model_optimization as tfmot

    (x, y), (x_test, y_test) = data
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        0.0, sparsity, begin_step=0,
        end_step=args.update_every * int(np.ceil(0.75 * steps / args.update_every)),
        frequency=args.update_every)
    model = tfmot.sparsity.keras.prune_low_magnitude(
        dense_mlp(args.widths, seed), pruning_schedule=schedule)
    compile_for_mnist(model)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
              callbacks=[tfmot.sparsity.keras.UpdatePruningStep()], shuffle=True)
    stripped = compile_for_mnist(tfmot.sparsity.keras.strip_pruning(model))
    kernels = [layer.kernel.numpy() for layer in stripped.layers]
    achieved = sum(np.sum(k == 0) for k in kernels) / sum(k.size for k in kernels)
    if abs(achieved - sparsity) > 0.01:
        raise RuntimeError(f"tfmot reached sparsity {achieved:.4f}, not {sparsity}")
    return stripped.evaluate(x_test, y_test, verbose=0)[1]


def run_all(args):
    data = mnist()
    runs = [("dense", None)] + [(m, s) for s in args.sparsities for m in METHODS]
    results = {}
    for index, (method, sparsity) in enumerate(runs):
        for seed in args.seeds:
            start = time.perf_counter()
            accuracy = train(method, sparsity, seed, data, args)
            results.setdefault((method, sparsity), []).append(accuracy)
            print(f"[{index + 1}/{len(runs)}] {method:6s} sparsity={sparsity} seed={seed}: "
                  f"test accuracy {accuracy:.4f} ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    return results


def report(results, args):
    print(f"\n{platform_line()}")
    print(f"MLP 784-{'-'.join(map(str, args.widths))}-10, {args.epochs} epochs, batch "
          f"{args.batch_size}, Adam 1e-3, seeds {args.seeds}, updates every "
          f"{args.update_every} steps, SparseDense densities {args.distribution}\n")
    print("| method | sparsity | test accuracy (mean ± std over seeds) |")
    print("|---|---|---|")
    for (method, sparsity), accuracies in results.items():
        print(f"| {method} | {'-' if sparsity is None else sparsity} | "
              f"{100 * np.mean(accuracies):.2f} ± {100 * np.std(accuracies):.2f} % |")
    dense = np.mean(results[("dense", None)])
    for sparsity in args.sparsities:
        rigl = np.mean(results[("rigl", sparsity)])
        static = np.mean(results[("static", sparsity)])
        print(f"sparsity {sparsity}: RigL - dense = {100 * (rigl - dense):+.2f} points "
              f"(target >= -1), RigL - static = {100 * (rigl - static):+.2f} points "
              "(target > 0)")


def plot(results, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    dense = results[("dense", None)]
    axis.axhline(100 * np.mean(dense), color="black", linestyle="--", label="dense")
    width = 0.8 / len(METHODS)
    for offset, method in enumerate(METHODS):
        means = [100 * np.mean(results[(method, s)]) for s in args.sparsities]
        spreads = [100 * np.std(results[(method, s)]) for s in args.sparsities]
        positions = np.arange(len(args.sparsities)) + (offset - 1.5) * width
        axis.bar(positions, means, width, yerr=spreads, label=method, capsize=3)
    axis.set_xticks(np.arange(len(args.sparsities)), [f"{s:.0%}" for s in args.sparsities])
    axis.set_xlabel("sparsity")
    axis.set_ylabel("MNIST sample test accuracy (%)")
    low = min(100 * np.mean(v) for v in results.values())
    axis.set_ylim(max(0, low - 5), 100)
    axis.legend(loc="lower left", ncol=5, fontsize=8)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--update-every", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.9, 0.98])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--distribution", choices=["uniform", "er", "erk"], default="uniform",
                        help="how SparseDense layers share the density (tfmot: uniform)")
    parser.add_argument("--plot", default="dynamic_sparsity_accuracy.png")
    args = parser.parse_args()
    results = run_all(args)
    report(results, args)
    plot(results, args)


if __name__ == "__main__":
    main()
