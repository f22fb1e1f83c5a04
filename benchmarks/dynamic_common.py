"""What the dynamic-sparsity benchmarks share: the platform line and the MLPs."""

import subprocess

import numpy as np

from tfsparse._keras import keras
from tfsparse.data import load_mnist_sample
from tfsparse.dynamic import erk_densities
from tfsparse.layers import SparseDense
from tfsparse.ops import kernels


def platform_line():
    """The CPU model (lscpu) and the SparseDense kernel variant in use."""
    cpu = "unknown CPU"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    variant = (f"tfsparse compiled kernels, variant {kernels.isa()}" if kernels.available()
               else "TensorFlow CSR ops (kernels not built)")
    return f"CPU: {cpu}; SparseDense kernels: {variant}"


def mnist():
    """The shipped MNIST sample as float32 vectors in [0, 1] and int labels."""
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    def flat(x):
        return x.reshape(len(x), -1).astype(np.float32) / 255.0
    return (flat(x_train), y_train.astype(np.int64)), (flat(x_test), y_test.astype(np.int64))


def sparse_mlp(widths, density, seed, distribution="uniform"):
    """784 -> widths... -> 10 of SparseDense layers with random patterns.

    ``density`` is global; ``distribution`` ("uniform", "er", "erk") shares it
    among the layers (``tfsparse.dynamic.erk_densities``).
    """
    shapes = list(zip((784, *widths), (*widths, 10)))
    densities = erk_densities(shapes, density, distribution)
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((784,))]
    for index, ((_, units), layer_density) in enumerate(zip(shapes, densities)):
        layers.append(SparseDense(units, density=layer_density, seed=seed * 100 + index,
                                  activation="relu" if index < len(widths) else None))
    return keras.Sequential(layers)


def dense_mlp(widths, seed):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((784,))]
    layers += [keras.layers.Dense(width, activation="relu") for width in widths]
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)


def compile_for_mnist(model, learning_rate=1e-3):
    model.compile(keras.optimizers.Adam(learning_rate),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
