"""FSSL end to end on real MNIST digits: train, compact, report, export, serve.

1. Trains a 784-1024-1024-10 MLP on the MNIST sample shipped with tfsparse,
   with group lasso on the rows and columns of its kernels
   (``tfsparse.regularizers.GroupLasso``) and the ``callbacks.FSSL`` schedule:
   penalty for ``--prune-epoch`` epochs, then the groups whose norm is under
   ``--threshold`` are zeroed and masked, then fine-tuning without the penalty.
2. Plots the share of zeroed groups per layer over the epochs (PNG).
3. Compacts the model (``tfsparse.fssl.compact``): removed neurons and input
   pixels are physically gone; prints ``tfsparse.fssl.report`` and checks
   that the compacted model gives the same outputs.
4. Exports the compacted model as a SavedModel and serves it from a fresh
   Python process that imports only TensorFlow, checking its predictions.

Runs in about a minute on 2 CPU cores. Usage:
    python examples/fssl_mnist.py [--out out/fssl_mnist] [--epochs 16]
"""

import argparse
import os
import pathlib
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from callbacks.fssl import FSSL  # noqa: E402
from tfsparse import fssl  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.regularizers import GroupLasso  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)

SERVE_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    served = tf.saved_model.load(sys.argv[1])
    serve = served.signatures["serving_default"]
    data = np.load(sys.argv[2])
    (name,) = serve.structured_input_signature[1].keys()
    (logits,) = serve(**{name: tf.constant(data["x"])}).values()
    predictions = np.argmax(logits.numpy(), axis=1)
    np.save(sys.argv[3], predictions)
    print(f"fresh process: accuracy {np.mean(predictions == data['y']):.4f} "
          f"on {len(predictions)} test digits")
""")


class EpochBar(keras.callbacks.Callback):
    """A tqdm bar over the epochs of one fit."""

    def __init__(self, epochs):
        super().__init__()
        self.bar = tqdm.tqdm(total=epochs, desc="FSSL training", unit="epoch")

    def on_epoch_end(self, epoch, logs=None):
        self.bar.set_postfix(loss=f"{logs['loss']:.3f}",
                             sparsity=f"{logs['fssl/group_sparsity']:.2f}")
        self.bar.update()

    def on_train_end(self, logs=None):
        self.bar.close()


def build_model(l):
    def layer(units, activation, groups, name):
        return keras.layers.Dense(units, activation, name=name,
                                  kernel_regularizer=GroupLasso(l, groups))

    return keras.Sequential([
        keras.Input((28, 28)),
        keras.layers.Flatten(),
        layer(1024, "relu", ("rows", "columns"), "hidden_1"),
        layer(1024, "relu", ("rows", "columns"), "hidden_2"),
        layer(10, None, "rows", "logits"),
    ], name="mlp")


def plot_sparsity(history, path, prune_epoch):
    keys = sorted(key for key in history if key.startswith("fssl/") and key.count("/") == 2)
    epochs = np.arange(1, len(history[keys[0]]) + 1)
    figure, axes = plt.subplots(figsize=(7, 4))
    for key in keys:
        axes.plot(epochs, 100 * np.array(history[key]), marker="o", label=key[len("fssl/"):])
    axes.axvline(prune_epoch + 0.5, color="gray", linestyle="--", label="groups removed")
    axes.set_xlabel("epoch")
    axes.set_ylabel("groups with norm <= threshold (%)")
    axes.set_title("FSSL: group sparsity per layer")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def serve_in_fresh_process(saved_model_dir, x, y, out):
    data_path, predictions_path = out / "serve_inputs.npz", out / "served_predictions.npy"
    np.savez(data_path, x=x, y=y)
    result = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT, str(saved_model_dir), str(data_path),
         str(predictions_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode != 0:
        raise RuntimeError(f"serving process failed:\n{result.stderr}")
    print(result.stdout.strip())
    return np.load(predictions_path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/fssl_mnist")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--prune-epoch", type=int, default=8)
    parser.add_argument("--l", type=float, default=1.5e-3, help="group lasso strength")
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
    x_train, x_test = x_train.astype(np.float32) / 255, x_test.astype(np.float32) / 255
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


def compact_export_and_serve(model, x_test, y_test, out):
    """Reports and compacts ``model``, checks the outputs, exports and serves the result.

    Returns:
        The report's rows (see ``tfsparse.fssl.report``).
    """
    print("\nCompaction (tfsparse.fssl.report):")
    rows = fssl.report(model)
    compacted = fssl.compact(model)
    compacted.summary()
    outputs = model.predict(x_test, verbose=0)
    compact_outputs = compacted.predict(x_test, verbose=0)
    print(f"multiply-adds per sample: {rows[-1]['macs_before']:,} -> "
          f"{rows[-1]['macs_after']:,} ({100 * rows[-1]['macs_removed']:.1f}% removed)")
    print(f"largest output difference, compacted vs FSSL model: "
          f"{np.abs(outputs - compact_outputs).max():.2e}")
    accuracy = np.mean(np.argmax(compact_outputs, axis=1) == y_test)
    print(f"test accuracy: compacted {accuracy:.4f}")

    saved_model_dir = out / "compacted_savedmodel"
    tf.saved_model.save(compacted, str(saved_model_dir))
    print(f"exported the compacted model to {saved_model_dir}")
    served = serve_in_fresh_process(saved_model_dir, x_test, y_test, out)
    agree = np.mean(served == np.argmax(compact_outputs, axis=1))
    print(f"fresh-process predictions agree with in-process ones on {100 * agree:.1f}% of digits")
    if agree != 1.0:
        raise SystemExit("the served model disagrees with the compacted model")
    return rows


if __name__ == "__main__":
    main()
