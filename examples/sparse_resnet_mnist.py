"""A pruned ResNet made sparse: train, prune with tfmot, strip_pruning, sparsify, check, save.

1. Trains a small ResNet (a stem convolution, residual blocks of two 3x3
   Conv2D + BatchNorm with ReLU and a residual Add, a strided block with a
   1x1 projection, GlobalAveragePooling, Dense) on the MNIST sample shipped
   with tfsparse.
2. Prunes a copy with tfmot's ``prune_low_magnitude`` (polynomial schedule to
   ``--sparsity``, every convolution but the stem, and the Dense layer) while
   fine-tuning, then ``strip_pruning``.
3. ``tfsparse.sparsify``: every pruned layer becomes a SparseConv2D /
   SparseDense (``--max-density 0.5``: all but the unpruned stem; the
   default rule would convert the convolutions only below its measured
   crossover density), prints the report, and checks that the sparse model
   predicts what the pruned one does (same classes, logits equal up to float
   rounding).
4. Fine-tunes the sparse model one more epoch (on its fixed pattern) and
   round-trips it through the ``.keras`` format.

About four and a half minutes on 2 shared CPU cores. Usage:
    python examples/sparse_resnet_mnist.py [--sparsity 0.9] [--epochs 4] [--prune-epochs 6]
        [--out out/sparse_resnet]
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow_model_optimization as tfmot  # noqa: E402

import tfsparse  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)

L = keras.layers
BATCH_SIZE = 64


def resnet(width=16, name="resnet"):
    """Stem, two blocks of ``width`` channels (28x28), two of ``2 * width`` (14x14), head."""
    inputs = keras.Input((28, 28, 1))
    x = _conv_bn(inputs, width, 1, "stem", relu=True)
    for index, (filters, stride) in enumerate([(width, 1), (width, 1),
                                                (2 * width, 2), (2 * width, 1)]):
        x = _block(x, filters, stride, f"block{index + 1}")
    x = L.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, L.Dense(10, name="logits")(x), name=name)


def _conv_bn(x, filters, stride, name, relu, size=3):
    x = L.Conv2D(filters, size, strides=stride, padding="same", use_bias=False,
                 name=f"{name}_conv")(x)
    # momentum 0.9: the moving statistics settle within the few hundred steps
    # this small sample gives (Keras's 0.99 would still be far off for eval).
    x = L.BatchNormalization(momentum=0.9, name=f"{name}_bn")(x)
    return L.ReLU(name=f"{name}_relu")(x) if relu else x


def _block(x, filters, stride, name):
    y = _conv_bn(x, filters, stride, f"{name}_1", relu=True)
    y = _conv_bn(y, filters, 1, f"{name}_2", relu=False)
    if stride != 1 or x.shape[-1] != filters:
        x = _conv_bn(x, filters, stride, f"{name}_projection", relu=False, size=1)
    return L.ReLU(name=f"{name}_out")(L.Add(name=f"{name}_add")([x, y]))


def load_data(limit=None):
    """The MNIST sample as ``((x_train, y_train), (x_test, y_test))``, images in [0, 1]."""
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    scale = np.float32(1 / 255)
    x_train, x_test = x_train[..., None] * scale, x_test[..., None] * scale
    if limit:
        x_train, y_train, x_test, y_test = (x_train[:limit], y_train[:limit],
                                            x_test[:limit], y_test[:limit])
    return (x_train, y_train), (x_test, y_test)


def compile_model(model, learning_rate=1e-3):
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train_dense(data, epochs, width=16, seed=0):
    (x, y), _ = data
    keras.utils.set_random_seed(seed)
    model = compile_model(resnet(width, name="dense"))
    print(f"training the dense ResNet, {epochs} epochs")
    model.fit(x, y, epochs=epochs, batch_size=BATCH_SIZE, verbose=2)
    return model


def prune(dense, data, sparsity, epochs, seed=0):
    """A pruned copy of ``dense``: fine-tuned under magnitude pruning, then stripped."""
    (x, y), _ = data
    keras.utils.set_random_seed(seed)
    copy = keras.models.clone_model(dense)
    copy.set_weights(dense.get_weights())
    steps = int(np.ceil(len(x) / BATCH_SIZE))
    # Sparsity ramps from 0 over the first two thirds of the steps, then the
    # rest fine-tune at the target. The last mask update lands on end_step, a
    # step that runs, so the target is reached.
    frequency = max(1, min(10, steps * epochs // 8))
    end_step = max(frequency, 2 * steps * epochs // 3 // frequency * frequency)
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        0.0, sparsity, begin_step=0, end_step=end_step, frequency=frequency)

    def wrap(layer):
        if isinstance(layer, (L.Conv2D, L.Dense)) and layer.name != "stem_conv":
            return tfmot.sparsity.keras.prune_low_magnitude(layer, pruning_schedule=schedule)
        return layer

    pruned = compile_model(keras.models.clone_model(copy, clone_function=wrap))
    print(f"pruning to {sparsity:.0%} while fine-tuning, {epochs} epochs")
    pruned.fit(x, y, epochs=epochs, batch_size=BATCH_SIZE, verbose=2,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    return compile_model(tfmot.sparsity.keras.strip_pruning(pruned))


def compare_predictions(pruned, sparse, x):
    """``(same classes share, largest |logit difference|, largest |logit|)``."""
    expected = pruned.predict(x, verbose=0, batch_size=256)
    logits = sparse.predict(x, verbose=0, batch_size=256)
    same = float(np.mean(expected.argmax(1) == logits.argmax(1)))
    return same, float(np.abs(expected - logits).max()), float(np.abs(expected).max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--epochs", type=int, default=4, help="dense training epochs")
    parser.add_argument("--prune-epochs", type=int, default=6,
                        help="fine-tuning epochs under pruning")
    parser.add_argument("--max-density", type=float, default=0.5)
    parser.add_argument("--out", default="out/sparse_resnet")
    args = parser.parse_args(argv)
    checks.check_command_line(parser, args, {
        "sparsity": checks.check_open_fraction, "epochs": checks.check_positive_int,
        "prune_epochs": checks.check_positive_int, "max_density": checks.check_fraction})
    data = load_data()
    (x_train, y_train), (x_test, y_test) = data
    pruned = prune(train_dense(data, args.epochs), data, args.sparsity, args.prune_epochs)
    sparse, report = tfsparse.sparsify(pruned, max_density=args.max_density, report=True)
    print(report)
    same, difference, largest = compare_predictions(pruned, sparse, x_test)
    accuracy = {name: model.evaluate(x_test, y_test, verbose=0)[1]
                for name, model in (("pruned", pruned), ("sparse", compile_model(sparse)))}
    print(f"test accuracy: pruned {accuracy['pruned']:.3f}, sparse {accuracy['sparse']:.3f}; "
          f"same class on {same:.1%} of the test digits; largest |logit difference| "
          f"{difference:.2e} (largest |logit| {largest:.1f})")
    sparse.fit(x_train, y_train, epochs=1, batch_size=BATCH_SIZE, verbose=2)
    path = pathlib.Path(args.out) / "sparse_resnet.keras"
    path.parent.mkdir(parents=True, exist_ok=True)
    sparse.save(path)
    loaded = keras.models.load_model(path)
    agree = np.array_equal(loaded.predict(x_test, verbose=0), sparse.predict(x_test, verbose=0))
    accuracy = sparse.evaluate(x_test, y_test, verbose=0)[1]
    print(f"test accuracy after one sparse epoch: {accuracy:.3f}; saved {path}, "
          f"reloaded with the same predictions: {agree}")


if __name__ == "__main__":
    main()
