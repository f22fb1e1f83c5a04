"""Small CNNs for the sparsify tests, and weights that make their outputs exact.

With small integer kernels, biases and inputs every product and partial sum
of a convolution or dense layer is an integer below 2**24, exactly
representable in float32, so any summation order gives the same bits. The
BatchNormalization layers get dyadic statistics (variance + epsilon = 1, so
the scale is exactly gamma): their outputs stay exact too. Then the
sparsified model must give the original's outputs bit for bit, and a test
can compare them with no tolerance at all.
"""

import numpy as np

from tfsparse._keras import keras

L = keras.layers


def sequential_cnn():
    return keras.Sequential([
        keras.Input((12, 12, 3)),
        L.Conv2D(8, 3, padding="same", activation="relu", name="conv1"),
        L.MaxPooling2D(name="pool"),
        L.Conv2D(8, 3, strides=2, name="conv2"),
        L.Conv2D(6, 1, use_bias=False, name="conv3"),
        L.Flatten(name="flatten"),
        L.Dense(5, name="logits"),
    ])


def residual_cnn():
    """Stem, a residual block with BatchNorm, a strided block with a 1x1 projection."""
    inputs = keras.Input((16, 16, 2))
    x = L.Conv2D(8, 3, padding="same", name="stem")(inputs)
    x = L.ReLU(name="stem_relu")(L.BatchNormalization(epsilon=0.25, name="stem_bn")(x))
    y = L.Conv2D(8, 3, padding="same", name="block1_conv1", activation="relu")(x)
    y = L.BatchNormalization(epsilon=0.25, name="block1_bn")(
        L.Conv2D(8, 3, padding="same", name="block1_conv2")(y))
    x = L.ReLU()(L.Add(name="block1_add")([x, y]))
    y = L.Conv2D(12, 3, strides=2, padding="same", dilation_rate=1, name="block2_conv1")(x)
    y = L.Conv2D(12, 3, padding="same", dilation_rate=2, name="block2_conv2")(L.ReLU()(y))
    shortcut = L.Conv2D(12, 1, strides=2, name="block2_projection")(x)
    x = L.ReLU()(L.Add(name="block2_add")([shortcut, y]))
    x = L.GlobalAveragePooling2D(name="pool")(x)  # 8 x 8: the mean divides by 64, exactly
    return keras.Model(inputs, L.Dense(4, name="logits")(x))


def branches_cnn():
    """Two inputs; one shared Conv2D on both; three branches concatenated."""
    left, right = keras.Input((10, 10, 3), name="left"), keras.Input((10, 10, 3), name="right")
    shared = L.Conv2D(6, 3, padding="same", name="shared", activation="relu")
    a, b = shared(left), shared(right)
    branches = [L.Conv2D(4, 3, padding="same", name="branch3x3")(a),
                L.Conv2D(4, 1, name="branch1x1")(a),
                L.Conv2D(4, 3, padding="same", dilation_rate=2, name="branch_dilated")(b),
                b]
    x = L.Concatenate(name="concat")(branches)
    x = L.Conv2D(8, 3, strides=2, padding="valid", name="merge")(x)
    return keras.Model([left, right], L.Dense(3, name="logits")(L.Flatten()(x)))


def integer_weights(model, density, seed=0):
    """Sets every Conv2D/Dense kernel to small integers, a ``density`` share nonzero."""
    rng = np.random.default_rng(seed)
    for layer in _all_layers(model):
        if isinstance(layer, (L.Conv2D, L.Dense)):
            shape = layer.kernel.shape
            kernel = rng.integers(-2, 3, shape) * (rng.random(shape) < density)
            kernel.flat[0] = 1  # never all zero
            weights = [kernel.astype(np.float32)]
            if layer.use_bias:
                weights.append(rng.integers(-3, 4, layer.bias.shape).astype(np.float32))
            layer.set_weights(weights)
        elif isinstance(layer, L.BatchNormalization):
            size = layer.gamma.shape
            layer.set_weights([
                rng.integers(1, 3, size).astype(np.float32),  # gamma
                rng.integers(-2, 3, size).astype(np.float32) / 2,  # beta
                rng.integers(-4, 5, size).astype(np.float32) / 4,  # moving mean
                np.full(size, 1 - layer.epsilon, np.float32)])  # var + epsilon = 1
    return model


def integer_inputs(model, batch=4, seed=1):
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 4, (batch, *tensor.shape[1:])).astype(np.float32)
              for tensor in model.inputs]
    return arrays if len(arrays) > 1 else arrays[0]


def _all_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)
        else:
            yield layer
