"""FSSL on a residual CNN with real MNIST digits: train, compact, report, export, serve.

1. Trains a small functional residual CNN (a stem convolution, a residual
   block with BatchNormalization, a convolution, a dense classifier) on the
   MNIST sample shipped with tfsparse, with SSL's group lasso on the filters
   and channels of its convolutions (``tfsparse.regularizers.GroupLasso``)
   and the ``callbacks.FSSL`` schedule: penalty for ``--prune-epoch``
   epochs, then the groups whose norm is under ``--threshold`` are zeroed and
   masked, then fine-tuning without the penalty.
2. Plots the share of zeroed groups per layer over the epochs (PNG).
3. Compacts the model (``tfsparse.fssl.compact``): removed filters and
   channels are physically gone, across the residual ``Add`` only where every
   addend lost them; prints ``tfsparse.fssl.report`` and checks that the
   compacted model gives the same outputs.
4. Exports the compacted model as a SavedModel and serves it from a fresh
   Python process that imports only TensorFlow, checking its predictions.

Runs in about two minutes on 2 CPU cores. Usage:
    python examples/fssl_cnn.py [--out out/fssl_cnn] [--epochs 10]
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from tfsparse._keras import keras  # noqa: E402

from callbacks.fssl import FSSL  # noqa: E402
from fssl_mnist import EpochBar  # noqa: E402  (examples/fssl_mnist.py)
from fssl_mnist import compact_export_and_serve  # noqa: E402
from fssl_mnist import plot_sparsity  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.regularizers import GroupLasso  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)

L = keras.layers


def build_model(l):
    """A residual CNN; every convolution carries SSL's filter (and channel) groups."""
    def conv(filters, size, name, groups=("filters", "channels"), **kwargs):
        return L.Conv2D(filters, size, name=name, kernel_regularizer=GroupLasso(l, groups),
                        **kwargs)

    inputs = keras.Input((28, 28, 1))
    x = conv(16, 3, "stem", groups="filters", activation="relu")(inputs)
    x = L.MaxPooling2D(name="stem_pool")(x)
    # Residual block: its inner channels go freely; the channels of the Add
    # only where the shortcut and the block both lost them.
    y = conv(32, 3, "block_a", padding="same", activation="relu", use_bias=False)(x)
    y = conv(16, 1, "block_b", use_bias=False)(y)
    y = L.BatchNormalization(name="block_bn")(y)
    x = L.ReLU(name="block_relu")(L.Add(name="residual")([x, y]))
    x = conv(32, 3, "conv", activation="relu")(x)
    x = L.MaxPooling2D(name="pool")(x)
    x = L.Flatten(name="flatten")(x)
    outputs = L.Dense(10, name="logits", kernel_regularizer=GroupLasso(l, "rows"))(x)
    return keras.Model(inputs, outputs, name="resnet")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/fssl_cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--prune-epoch", type=int, default=5)
    parser.add_argument("--l", type=float, default=8e-3, help="group lasso strength")
    parser.add_argument("--threshold", type=float, default=0.05, help="group norm threshold")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    checks.check_command_line(parser, args, {
        "epochs": checks.check_positive_int, "prune_epoch": checks.check_positive_int,
        "l": checks.check_non_negative_float, "threshold": checks.check_non_negative_float,
        "seed": checks.check_non_negative_int})
    if args.prune_epoch > args.epochs:  # FSSL's check, before any work
        parser.error(f"--prune-epoch must be at most --epochs={args.epochs}, received "
                     f"{args.prune_epoch}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train[..., None].astype(np.float32) / 255
    x_test = x_test[..., None].astype(np.float32) / 255
    keras.utils.set_random_seed(args.seed)
    model = build_model(args.l)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(
        x_train, y_train, epochs=args.epochs, batch_size=64, verbose=0,
        callbacks=[FSSL(args.threshold, prune_epoch=args.prune_epoch, verbose=1),
                   EpochBar(args.epochs)]).history
    plot_path = out / "group_sparsity.png"
    plot_sparsity(history, plot_path, args.prune_epoch)
    print(f"wrote {plot_path}")

    compact_export_and_serve(model, x_test, y_test, out)


if __name__ == "__main__":
    main()
