"""Dynamic sparse training: RigL (or SET) on real MNIST digits, computing on nonzeros only.

    python examples/rigl_mnist.py [--method rigl|set] [--sparsity 0.9] [--epochs 10]
        [--distribution erk] [--out out/rigl_mnist]

Trains a 784-1024-1024-10 MLP of SparseDense layers from scratch at a global
sparsity, the layers' densities chosen by RigL's Erdos-Renyi-Kernel rule
(``tfsparse.dynamic.erk_densities``), while ``callbacks.DynamicSparsity``
moves the pattern: every 50 steps until 75% of training each layer drops the
smallest weights and regrows where the dense gradient of the step's batch
is largest (RigL) or at random (SET). ``keras.callbacks.BackupAndRestore`` makes the run
resumable (interrupt it and run it again). Prints the test accuracy, how
much of each layer's pattern moved, and saves the model in the Keras format,
whose reload carries the final pattern.
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the callbacks package

import numpy as np  # noqa: E402

from callbacks import DynamicSparsity  # noqa: E402
from tfsparse import SparseDense  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.dynamic import erk_densities  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)

WIDTHS = (784, 1024, 1024, 10)


def build(sparsity, distribution, seed):
    shapes = list(zip(WIDTHS[:-1], WIDTHS[1:]))
    densities = erk_densities(shapes, 1 - sparsity, distribution)
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((784,))]
    for index, ((_, units), density) in enumerate(zip(shapes, densities)):
        last = index == len(shapes) - 1
        layers.append(SparseDense(units, density=density, seed=seed + index,
                                  activation=None if last else "relu"))
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default, choices in (
            ("--method", str, "rigl", ["rigl", "set"]),
            ("--sparsity", float, 0.9, None),
            ("--distribution", str, "erk", ["erk", "er", "uniform"]),
            ("--epochs", int, 10, None),
            ("--batch-size", int, 64, None),
            ("--seed", int, 0, None),
            ("--out", str, "out/rigl_mnist", None)):
        parser.add_argument(flag, type=kind, default=default, choices=choices)
    args = parser.parse_args()
    checks.check_command_line(parser, args, {
        "sparsity": checks.check_open_fraction, "epochs": checks.check_positive_int,
        "batch_size": checks.check_positive_int, "seed": checks.check_non_negative_int})
    return args


def flat_digits():
    """The shipped MNIST sample as [n, 784] float32 in [0, 1]."""
    return [(x.reshape(len(x), 784).astype("float32") / 255, y)
            for x, y in load_mnist_sample()]


def main():
    args = parse_arguments()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (x_train, y_train), (x_test, y_test) = flat_digits()

    model = build(args.sparsity, args.distribution, args.seed)
    initial = [layer.pattern for layer in model.layers]
    for layer in model.layers:
        print(f"{layer.name}: {layer.input_dim} x {layer.units}, density {layer.density:.4f}")
    dynamic = DynamicSparsity(args.method, update_every=50, drop_fraction=0.3,
                              end_step=0.75, seed=args.seed)
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_test, y_test), verbose=2, callbacks=[
                  dynamic, keras.callbacks.BackupAndRestore(str(out / "backup"))])

    accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
    print(f"\n{args.method.upper()} at {args.sparsity:.0%} sparsity "
          f"({args.distribution}): test accuracy {accuracy:.4f}, "
          f"{len(dynamic.updates)} updates taking "
          f"{sum(u['seconds'] for u in dynamic.updates):.1f} s in all")
    for layer, start in zip(model.layers, initial):
        start_keys = set(zip(start.rows.tolist(), start.cols.tolist()))
        now = set(zip(layer.pattern.rows.tolist(), layer.pattern.cols.tolist()))
        print(f"{layer.name}: {len(now - start_keys) / layer.nnz:.1%} of the nonzeros "
              "are at positions the initial pattern did not have")

    path = out / "model.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    same = all(a.pattern == b.pattern for a, b in zip(model.layers, reloaded.layers))
    np.testing.assert_array_equal(reloaded.predict(x_test[:8], verbose=0),
                                  model.predict(x_test[:8], verbose=0))
    print(f"saved to {path}; the reloaded model has the final pattern: {same}")


if __name__ == "__main__":
    main()
