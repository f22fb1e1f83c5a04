"""The main job: a sparse MLP on real MNIST digits, against the same model dense.

    python examples/mnist_sparse.py [--epochs 8] [--density 0.05] [--out out/mnist_sparse]

Trains a 784-1024-1024-10 MLP twice with ``model.fit`` on the MNIST sample
shipped with tfsparse: once with ``SparseDense`` hidden layers (5% of the
weights) and once with ``Dense`` layers. Reports accuracy, training time per
epoch and inference time of both, exports the sparse model as a SavedModel
and as a TFLite file (``tfsparse.export.to_tflite``), then serves both from
fresh Python processes in which tfsparse is not importable
(``examples/serve_saved_model.py``).
"""

import argparse
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse import SparseDense  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.export import to_tflite  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)


def build_mlp(hidden_layer, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((784,)),
            hidden_layer(1024, "relu"),
            hidden_layer(1024, "relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


class EpochTimer(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def train_and_measure(name, model, data, epochs, batch_size):
    (x_train, y_train), (x_test, y_test) = data
    model.compile(
        keras.optimizers.Adam(1e-3),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    timer = EpochTimer()
    print(f"\n== {name}")
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch_size,
              validation_data=(x_test, y_test), callbacks=[timer], verbose=2)
    accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
    predict = tf.function(lambda x: model(x, training=False))
    predict(x_test)  # trace once
    repeats = []
    for _ in range(10):
        start = time.perf_counter()
        predict(x_test).numpy()
        repeats.append(time.perf_counter() - start)
    weights = sum(
        layer.nnz if isinstance(layer, SparseDense) else layer.kernel.shape.num_elements()
        for layer in model.layers
    )
    return {
        "name": name,
        "accuracy": accuracy,
        "weights": weights,
        # the first epoch includes tracing; the median of the rest is the speed
        "epoch_s": float(np.median(timer.times[1:] or timer.times)),
        "inference_ms": float(np.median(repeats)) * 1e3,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="out/mnist_sparse")
    args = parser.parse_args()
    checks.check_command_line(parser, args, {
        "epochs": checks.check_positive_int, "batch_size": checks.check_positive_int,
        "density": checks.check_fraction, "seed": checks.check_non_negative_int})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    data = (x_train, y_train), (x_test, y_test)
    print(f"MNIST sample: {len(x_train)} training and {len(x_test)} test digits")

    sparse_model = build_mlp(
        lambda units, act: SparseDense(units, density=args.density, activation=act),
        args.seed,
    )
    dense_model = build_mlp(
        lambda units, act: keras.layers.Dense(units, activation=act), args.seed
    )
    results = [
        train_and_measure(f"SparseDense ({args.density:.0%} of weights)", sparse_model,
                          data, args.epochs, args.batch_size),
        train_and_measure("Dense", dense_model, data, args.epochs, args.batch_size),
    ]
    sparse, dense = results
    print(f"\n{'model':<28} {'accuracy':>9} {'weights':>10} {'s/epoch':>8} "
          f"{'inference ms':>13}")
    for r in results:
        print(f"{r['name']:<28} {r['accuracy']:>9.4f} {r['weights']:>10,} "
              f"{r['epoch_s']:>8.2f} {r['inference_ms']:>13.2f}")
    print(f"SparseDense vs Dense: training {dense['epoch_s'] / sparse['epoch_s']:.1f}x faster "
          f"per epoch, inference {dense['inference_ms'] / sparse['inference_ms']:.1f}x "
          f"faster ({len(x_test)} digits), accuracy "
          f"{100 * (sparse['accuracy'] - dense['accuracy']):+.2f} points")

    saved = out / "saved_model"
    tf.saved_model.save(sparse_model, str(saved))
    np.save(out / "inputs.npy", x_test[:10])
    np.save(out / "labels.npy", y_test[:10])
    tflite = out / "model.tflite"
    tflite.write_bytes(to_tflite(sparse_model))  # TFLite builtin ops only
    for exported in (saved, tflite):
        print(f"\nexported the sparse model to {exported}; serving it in a fresh process:")
        subprocess.run(
            [sys.executable, str(pathlib.Path(__file__).parent / "serve_saved_model.py"),
             str(exported), "--inputs", str(out / "inputs.npy"),
             "--labels", str(out / "labels.npy")],
            check=True,
        )


if __name__ == "__main__":
    main()
