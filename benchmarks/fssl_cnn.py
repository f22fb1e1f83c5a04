"""FSSL on a real CNN: dense vs unstructured sparse vs FSSL + compaction, side by side.

Three copies of one VGG-like CNN (conv 32-32, pool, conv 64-64, pool, dense
128, dense 10; "valid" padding) train on the MNIST sample shipped with
tfsparse (4,000 training and 1,000 test digits), in one process, with the
same optimizer, batch size and number of epochs:

- dense: the plain CNN;
- FSSL: group lasso on the filters and channels of every convolution (filters
  only for the first, whose one input channel is the image) and on the rows
  and columns of the dense layers (rows only for the output layer), the
  ``callbacks.FSSL`` schedule (penalty, prune at ``--prune-epoch``,
  fine-tune), then ``tfsparse.fssl.compact``: removed filters and channels
  are gone, the convolutions are smaller dense convolutions;
- unstructured sparse: tfmot magnitude pruning (``prune_low_magnitude``,
  polynomial decay to the sparsity that leaves the compacted FSSL model's
  number of nonzeros), ``strip_pruning``, then ``tfsparse.sparsify``, which
  turns the Dense layers into SparseDense. tfsparse has no sparse convolution
  yet, so this model's convolutions run as dense convolutions over masked
  kernels: the model that actually runs.

It prints test accuracy, kernel nonzeros, multiply-adds per image (a dense
convolution multiplies every kernel entry at every output position, zeros
included; a SparseDense only its stored values), the inference time of a
batch and the training-step time (medians of interleaved runs inside
``tf.function``), the ratios against the targets (FSSL within 1 point of
dense; inference at least 2x faster than dense and than unstructured), the
CPU model and the SpMM kernel variant.

Usage:
    python benchmarks/fssl_cnn.py [--epochs 18] [--prune-epoch 7] [--l 5e-3]
        [--rounds 3] [--repeats 20]
"""

import json
import os
import pathlib
import platform
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_model_optimization as tfmot  # noqa: E402

import tfsparse  # noqa: E402
from callbacks.fssl import FSSL  # noqa: E402
from tfsparse import fssl  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.ops import kernels  # noqa: E402
from tfsparse.regularizers import GroupLasso  # noqa: E402
from fssl_mnist import compile_model  # noqa: E402  (benchmarks/fssl_mnist.py)
from fssl_mnist import inference_function  # noqa: E402
from fssl_mnist import parse_args as fssl_benchmark_args  # noqa: E402
from fssl_mnist import train  # noqa: E402
from fssl_mnist import time_side_by_side  # noqa: E402
from fssl_mnist import train_steps  # noqa: E402

CONVS = (32, 32, "pool", 64, 64, "pool")
HIDDEN = 128


def cnn(l=None, name="cnn"):
    """The VGG-like CNN; with ``l``, group lasso of strength ``l`` on every kernel."""
    def reg(groups):
        return None if l is None else GroupLasso(l, groups)

    inputs = keras.Input((28, 28, 1))
    x, first = inputs, True
    for i, spec in enumerate(CONVS):
        if spec == "pool":
            x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
            continue
        groups = "filters" if first else ("filters", "channels")
        x = keras.layers.Conv2D(spec, 3, activation="relu", name=f"conv{i}",
                                kernel_regularizer=reg(groups))(x)
        first = False
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(HIDDEN, "relu", name="hidden",
                           kernel_regularizer=reg(("rows", "columns")))(x)
    outputs = keras.layers.Dense(10, name="logits", kernel_regularizer=reg("rows"))(x)
    return keras.Model(inputs, outputs, name=name)


def kernel_layers(model):
    return [layer for layer in model.layers
            if isinstance(layer, (SparseDense, keras.layers.Dense, keras.layers.Conv2D))]


def nonzeros(model):
    """Kernel nonzeros (the stored values of a SparseDense)."""
    return sum(layer.nnz if isinstance(layer, SparseDense)
               else int(np.count_nonzero(layer.kernel.numpy())) for layer in kernel_layers(model))


def kernel_entries(model):
    return sum(layer.nnz if isinstance(layer, SparseDense) else int(np.prod(layer.kernel.shape))
               for layer in kernel_layers(model))


def multiply_adds(model):
    """Per image: every kernel entry at every output position; the stored values of a SparseDense."""
    total = 0
    for layer in kernel_layers(model):
        positions = int(np.prod(layer.output.shape[1:-1] or [1]))
        stored = layer.nnz if isinstance(layer, SparseDense) else int(np.prod(layer.kernel.shape))
        total += positions * stored
    return total


def unstructured(sparsity, steps, args):
    """A fresh dense CNN under tfmot magnitude pruning to ``sparsity``."""
    keras.utils.set_random_seed(args.seed)
    frequency = 10  # the last mask update falls on end_step: the final sparsity is reached
    end_step = max(frequency, (steps * args.prune_epoch) // frequency * frequency)
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        0.0, sparsity, begin_step=0, end_step=end_step, frequency=frequency)
    return tfmot.sparsity.keras.prune_low_magnitude(cnn(name="unstructured"),
                                                    pruning_schedule=schedule)


def cpu_and_kernel():
    """The CPU's model name (as ``lscpu`` shows it) and the SpMM kernel variant that runs."""
    model = platform.processor()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    variant = kernels.isa()
    return model, (f"compiled, {variant}" if variant
                   else "TensorFlow CSR ops (compiled kernels not available)")


def parse_args(argv):
    return fssl_benchmark_args(argv, __doc__, {
        "epochs": 18, "prune_epoch": 7, "l": 5e-3, "repeats": 20,
        "out": "out/fssl_cnn_benchmark.json"})


def load(args):
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    scale = np.float32(1 / 255)
    return ((x_train[..., None] * scale, y_train), (x_test[..., None] * scale, y_test))


def train_all(data, args):
    """The three models, trained; returns (models, FSSL model before compaction, fit seconds)."""
    (x, y), _ = data
    keras.utils.set_random_seed(args.seed)
    dense = cnn(name="dense")
    fits = {"dense": train("dense", dense, x, y, args)}

    keras.utils.set_random_seed(args.seed)
    fssl_model = cnn(args.l, name="fssl")
    fits["FSSL compacted"] = train("FSSL", fssl_model, x, y, args,
                                   [FSSL(args.threshold, prune_epoch=args.prune_epoch)])
    compacted = compile_model(fssl.compact(fssl_model), 1e-3)

    steps = int(np.ceil(len(x) / args.batch_size))
    sparsity = 1 - nonzeros(compacted) / kernel_entries(dense)
    pruned = unstructured(sparsity, steps, args)
    fits["unstructured sparse"] = train(
        "unstructured", pruned, x, y, args, [tfmot.sparsity.keras.UpdatePruningStep()])
    sparse = compile_model(tfsparse.sparsify(tfmot.sparsity.keras.strip_pruning(pruned)), 1e-3)
    models = {"dense": dense, "unstructured sparse": sparse, "FSSL compacted": compacted}
    return models, fssl_model, fits


def main(argv=None):
    args = parse_args(argv)
    data = load(args)
    (x_train, y_train), (x_test, y_test) = data
    models, fssl_model, fits = train_all(data, args)
    # Counted now: the timed training steps below change the weights.
    nnz = {name: nonzeros(model) for name, model in models.items()}
    macs = {name: multiply_adds(model) for name, model in models.items()}
    table = fssl.report(fssl_model)
    accuracy = {name: model.evaluate(x_test, y_test, verbose=0)[1]
                for name, model in models.items()}
    accuracy["FSSL uncompacted"] = fssl_model.evaluate(x_test, y_test, verbose=0)[1]

    batch = tf.constant(x_test[:args.inference_batch])
    candidates = {name: inference_function(model, batch) for name, model in models.items()}
    rounds, infer, step_times = time_side_by_side(
        candidates, train_steps(models, x_train, y_train, args), args)

    cpu, variant = cpu_and_kernel()
    print(f"\nMNIST sample, CNN conv{'-'.join(map(str, CONVS))}-dense{HIDDEN}-10, "
          f"{args.epochs} epochs (FSSL: {args.prune_epoch} with group lasso l={args.l:g}, "
          f"then fine-tune), inference batch {args.inference_batch}, train batch "
          f"{args.batch_size}\nCPU: {cpu}; sparse kernel: {variant}")
    print("| model | test accuracy | kernel nnz | multiply-adds / image | inference (ms) "
          "| train step (ms) | fit (s) |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        print(f"| {name} | {100 * accuracy[name]:.1f}% | {nnz[name]:,} | "
              f"{macs[name]:,} | {1e3 * infer[name]:.2f} | "
              f"{1e3 * step_times[name]:.2f} | {fits[name]:.0f} |")
    gap = 100 * (accuracy["dense"] - accuracy["FSSL compacted"])
    print(f"\naccuracy gap dense - FSSL compacted: {gap:.2f} points (target <= 1); "
          f"FSSL before compaction {100 * accuracy['FSSL uncompacted']:.1f}%")
    for other in ("dense", "unstructured sparse"):
        ratios = [r[other] / r["FSSL compacted"] for r in rounds]
        print(f"inference, {other} / FSSL compacted: "
              + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
              + f" per round (median {np.median(ratios):.2f}x; target >= 2)")
    for other in ("dense", "unstructured sparse"):
        print(f"train step, {other} / FSSL compacted: "
              f"{step_times[other] / step_times['FSSL compacted']:.2f}x")
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "args": vars(args), "cpu": cpu, "kernel": variant, "accuracy": accuracy,
        "inference_s": infer, "inference_rounds_s": rounds, "train_step_s": step_times,
        "fit_s": fits, "nnz": nnz, "multiply_adds": macs,
        "report": table}, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
