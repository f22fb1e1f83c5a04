"""FSSL on real MNIST: dense vs unstructured sparse vs FSSL + compaction, side by side.

Three 784-1024-1024-10 ReLU MLPs train on the MNIST sample shipped with
tfsparse (4,000 training and 1,000 test digits), in one process, with the same
optimizer, batch size and number of epochs:

- dense: ``Dense`` layers;
- FSSL: the same ``Dense`` layers with group lasso on rows and columns
  (``GroupLasso(l, ("rows", "columns"))``, rows only for the output layer),
  the ``callbacks.FSSL`` schedule (penalty, prune at ``--prune-epoch``,
  fine-tune), then ``tfsparse.fssl.compact``;
- unstructured sparse: ``SparseDense`` layers with random fixed patterns
  holding the same total number of nonzeros as the compacted FSSL model.

It prints test accuracy, nonzeros, the inference time of a batch and the
training-step time (medians of interleaved repeated runs inside
``tf.function``), and the ratios the README quotes. Targets: compacted FSSL
within 1 point of the dense accuracy, and its inference at least 2x faster
than the unstructured sparse model with the same nonzeros.

Inference is timed in ``--rounds`` rounds of ``--repeats`` interleaved runs;
the table shows the median of the round medians and the ratios are printed
per round. The batch is a tensor, as in the other benchmarks; the same models
fed the NumPy batch (converted on every call, as this script timed before)
and the compacted model with a plain ``tf.gather`` in place of its
``GatherInputs`` layer are timed in the same rounds.

Usage:
    python benchmarks/fssl_mnist.py [--epochs 20] [--prune-epoch 8] [--l 1.5e-3]
        [--rounds 3] [--repeats 30]
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tqdm  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from callbacks.fssl import FSSL  # noqa: E402
from tfsparse import fssl  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.regularizers import GroupLasso  # noqa: E402
from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)

HIDDEN = (1024, 1024)
TF_GATHER = "FSSL compacted, tf.gather inputs"


class EpochBar(keras.callbacks.Callback):
    """A tqdm bar over the epochs of one fit."""

    def __init__(self, label, epochs):
        super().__init__()
        self.bar = tqdm.tqdm(total=epochs, desc=label, leave=False)

    def on_epoch_end(self, epoch, logs=None):
        self.bar.set_postfix(loss=f"{logs['loss']:.3f}")
        self.bar.update()

    def on_train_end(self, logs=None):
        self.bar.close()


def mlp(layer_factory):
    return keras.Sequential(
        [keras.Input((784,))]
        + [layer_factory(units, "relu", i) for i, units in enumerate(HIDDEN)]
        + [layer_factory(10, None, len(HIDDEN))])


def compile_model(model, learning_rate):
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def kernel_entries(model):
    """Stored kernel entries: all of a Dense kernel, the nonzeros of a SparseDense."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, SparseDense):
            total += layer.nnz
        elif isinstance(layer, keras.layers.Dense):
            total += int(np.prod(layer.kernel.shape))
    return total


def inference_function(model, x):
    call = tf.function(lambda inputs: model(inputs, training=False))
    return lambda: call(x).numpy()


def with_tf_gather(model):
    """``model`` (starting with GatherInputs) with ``tf.gather`` in place of that layer."""
    gather, *rest = model.layers

    def call(inputs, training=False):
        outputs = tf.gather(inputs, gather.indices, axis=-1)
        for layer in rest:
            outputs = layer(outputs, training=training)
        return outputs

    return call


def inference_candidates(models, batch):
    """Timed callables: each model on the batch as a tensor and as a NumPy array.

    When the compacted model starts with GatherInputs, it is also timed with a
    plain ``tf.gather`` in its place.
    """
    tensor = tf.constant(batch)
    runs = {}
    for name, model in models.items():
        runs[name] = inference_function(model, tensor)
        runs[f"{name}, NumPy input"] = inference_function(model, batch)
    compacted = models["FSSL compacted"]
    if isinstance(compacted.layers[0], fssl.GatherInputs):
        runs[TF_GATHER] = inference_function(with_tf_gather(compacted), tensor)
    return runs


def print_ratios(rounds):
    """Per round, unstructured sparse / FSSL compacted inference (and the variants)."""
    pairs = [("", "unstructured sparse", "FSSL compacted"),
             (", NumPy input", "unstructured sparse, NumPy input", "FSSL compacted, NumPy input"),
             (", tf.gather in place of GatherInputs", "unstructured sparse", TF_GATHER)]
    for label, numerator, denominator in pairs:
        if denominator not in rounds[0]:
            continue
        ratios = [r[numerator] / r[denominator] for r in rounds]
        print(f"inference, unstructured sparse / FSSL compacted{label}: "
              + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
              + f" per round (median {np.median(ratios):.2f}x; target >= 2)")


def train_step_function(model, x, y, with_regularization):
    optimizer = keras.optimizers.Adam(1e-4)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
            if with_regularization and model.losses:
                loss += tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return lambda: step(x, y).numpy()


MLP_DEFAULTS = {"epochs": 20, "prune_epoch": 8, "l": 1.5e-3, "repeats": 30,
                "out": "out/fssl_mnist_benchmark.json"}


def train_steps(models, x, y, args):
    """A timed training step (no regularisation) per model, on the first batch."""
    return {name: train_step_function(model, x[:args.batch_size], y[:args.batch_size], False)
            for name, model in models.items()}


def time_side_by_side(inference, steps, args):
    """``(rounds, median inference, median train step)``, all interleaved.

    ``rounds`` holds the per-round inference medians; the inference medians
    are the median over rounds.
    """
    rounds = [interleaved_medians(inference, args.repeats, seed=r)
              for r in tqdm.trange(args.rounds, desc="inference rounds", leave=False)]
    infer = {name: float(np.median([r[name] for r in rounds])) for name in inference}
    return rounds, infer, interleaved_medians(steps, args.repeats)


def parse_args(argv, description=__doc__, defaults=None):
    """The FSSL benchmarks' options; ``defaults`` overrides :data:`MLP_DEFAULTS`."""
    settings = {**MLP_DEFAULTS, **(defaults or {})}
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=settings["epochs"])
    parser.add_argument("--prune-epoch", type=int, default=settings["prune_epoch"])
    parser.add_argument("--l", type=float, default=settings["l"], help="group lasso strength")
    parser.add_argument("--threshold", type=float, default=0.05, help="group norm threshold")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--inference-batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=settings["repeats"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of inference timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=settings["out"])
    return parser.parse_args(argv)


def train(label, model, x, y, args, callbacks=()):
    compile_model(model, 1e-3)
    start = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0,
              callbacks=[*callbacks, EpochBar(label, args.epochs)])
    return time.perf_counter() - start


def main(argv=None):
    args = parse_args(argv)
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train.reshape(-1, 784).astype(np.float32) / 255
    x_test = x_test.reshape(-1, 784).astype(np.float32) / 255

    keras.utils.set_random_seed(args.seed)
    dense = mlp(lambda units, act, i: keras.layers.Dense(units, act))
    dense_fit = train("dense", dense, x_train, y_train, args)

    keras.utils.set_random_seed(args.seed)
    def regularized(units, act, i):
        groups = "rows" if i == len(HIDDEN) else ("rows", "columns")
        return keras.layers.Dense(units, act, kernel_regularizer=GroupLasso(args.l, groups))
    fssl_model = mlp(regularized)
    penalty_step = train_step_function(
        mlp(regularized), x_train[:args.batch_size], y_train[:args.batch_size], True)
    fssl_fit = train("FSSL", fssl_model, x_train, y_train, args,
                     [FSSL(args.threshold, prune_epoch=args.prune_epoch)])
    table = fssl.report(fssl_model)
    compacted = compile_model(fssl.compact(fssl_model), 1e-3)
    target_nnz = kernel_entries(compacted)

    keras.utils.set_random_seed(args.seed)
    density = target_nnz / kernel_entries(dense)
    sparse = mlp(lambda units, act, i: SparseDense(units, density=density, seed=args.seed + i,
                                                    activation=act))
    sparse_fit = train("unstructured sparse", sparse, x_train, y_train, args)

    models = {"dense": dense, "unstructured sparse": sparse, "FSSL compacted": compacted}
    accuracy = {name: model.evaluate(x_test, y_test, verbose=0)[1]
                for name, model in models.items()}
    accuracy["FSSL uncompacted"] = fssl_model.evaluate(x_test, y_test, verbose=0)[1]
    batch = x_test[:args.inference_batch]
    candidates = inference_candidates(models, batch)
    steps = train_steps(models, x_train, y_train, args)
    steps["FSSL penalty phase (dense + group lasso)"] = penalty_step
    rounds, infer, step_times = time_side_by_side(candidates, steps, args)

    # The FSSL row's fit time is the whole schedule on the full-size model.
    fit_seconds = {"dense": dense_fit, "unstructured sparse": sparse_fit,
                   "FSSL compacted": fssl_fit}
    print(f"\nMNIST sample, 784-{'-'.join(map(str, HIDDEN))}-10, {args.epochs} epochs "
          f"(FSSL: {args.prune_epoch} with group lasso l={args.l:g}, then fine-tune), "
          f"inference batch {args.inference_batch}, train batch {args.batch_size}")
    print("| model | test accuracy | kernel nnz | inference (ms) | train step (ms) | fit (s) |")
    print("|---|---|---|---|---|---|")
    for name, model in models.items():
        print(f"| {name} | {100 * accuracy[name]:.1f}% | {kernel_entries(model):,} | "
              f"{1e3 * infer[name]:.2f} | {1e3 * step_times[name]:.2f} | {fit_seconds[name]:.0f} |")
    penalty_name = "FSSL penalty phase (dense + group lasso)"
    print(f"| {penalty_name} | {100 * accuracy['FSSL uncompacted']:.1f}% (uncompacted) | "
          f"{kernel_entries(dense):,} | - | {1e3 * step_times[penalty_name]:.2f} | - |")
    gap = 100 * (accuracy["dense"] - accuracy["FSSL compacted"])
    print(f"\naccuracy gap dense - FSSL compacted: {gap:.2f} points (target <= 1)")
    print_ratios(rounds)
    print(f"inference, dense / FSSL compacted: {infer['dense'] / infer['FSSL compacted']:.2f}x")
    print(f"train step, unstructured sparse / FSSL compacted: "
          f"{step_times['unstructured sparse'] / step_times['FSSL compacted']:.2f}x")
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "accuracy": accuracy, "inference_s": infer,
                                "inference_rounds_s": rounds,
                                "train_step_s": step_times, "fit_s": fit_seconds,
                                "nnz": {n: kernel_entries(m) for n, m in models.items()},
                                "report": table}, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
