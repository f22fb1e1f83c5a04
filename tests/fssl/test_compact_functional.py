"""compact() and report() on functional models: CNNs, residual nets, Concatenate, MLPs."""

import warnings

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse import fssl
from tfsparse.layers import SparseDense

L = keras.layers


def vgg():
    inputs = keras.Input((12, 12, 3))
    x = L.Conv2D(8, 3, padding="same", activation="relu", name="c1")(inputs)
    x = L.Conv2D(8, 3, padding="same", activation="relu", name="c2")(x)
    x = L.MaxPooling2D(name="pool")(x)
    x = L.Conv2D(12, 3, padding="valid", activation="relu", name="c3")(x)
    x = L.Conv2D(10, 1, activation="relu", name="c4")(x)
    x = L.Flatten(name="flat")(x)
    x = L.Dense(16, activation="relu", name="d1")(x)
    x = L.Dropout(0.3)(x)
    return keras.Model(inputs, L.Dense(5, name="logits")(x), name="vgg")


def resnet():
    inputs = keras.Input((10, 10, 3))
    x = L.Conv2D(8, 3, padding="same", use_bias=False, name="stem")(inputs)
    x = L.ReLU()(L.BatchNormalization(name="stem_bn")(x))
    shortcut = x
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="b1")(x)
    y = L.Activation("relu")(L.BatchNormalization(name="b1_bn")(y))
    y = L.Conv2D(8, 1, use_bias=False, name="b2")(y)
    y = L.BatchNormalization(name="b2_bn")(y)
    x = L.ReLU()(L.Add(name="add")([shortcut, y]))
    x = L.Conv2D(12, 1, strides=2, name="down")(x)
    x = L.ELU()(L.BatchNormalization(name="down_bn")(x))
    x = L.AveragePooling2D(padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(4, activation="softmax", name="out")(x), name="resnet")


def concatenated():
    inputs = keras.Input((9, 9, 2))
    a = L.Conv2D(6, 3, activation="relu", name="a")(inputs)
    b = L.Conv2D(5, 3, activation="tanh", name="b")(inputs)
    x = L.Concatenate(name="cat")([a, b])
    x = L.Conv2D(7, 3, activation="sigmoid", name="after")(x)
    x = L.GlobalMaxPooling2D()(x)
    return keras.Model(inputs, L.Dense(3, name="out")(x), name="concat")


def mlp(sparse):
    inputs = keras.Input((20,))
    if sparse:
        x = SparseDense(16, density=0.5, seed=1, activation="relu", name="h1")(inputs)
        x = SparseDense(12, density=0.6, seed=2, activation="sigmoid", name="h2")(x)
    else:
        x = L.Dense(16, "relu", name="h1")(inputs)
        x = L.Dense(12, "tanh", name="h2")(x)
    return keras.Model(inputs, L.Dense(5, name="out")(L.Dropout(0.2)(x)), name="mlp")


def with_lambda():
    inputs = keras.Input((8, 8, 2))
    x = L.Conv2D(6, 3, activation="relu", name="c1")(inputs)
    x = L.Lambda(lambda t: t * 2.0, name="double")(x)
    x = L.Conv2D(5, 1, activation="relu", name="c2")(x)
    x = L.Flatten()(x)
    return keras.Model(inputs, L.Dense(3, name="out")(x), name="lambda_model")


MODELS = {"vgg": vgg, "resnet": resnet, "concat": concatenated,
          "mlp_dense": lambda: mlp(False), "mlp_sparse": lambda: mlp(True),
          "lambda": with_lambda}


def randomize(model, rng):
    """Random biases and BatchNorm statistics, then zero groups as FSSL would.

    Every kernel but the output layer's loses a third of its filters/units and
    a fifth of its input channels; half the zeroed filters get a negative bias
    (their constant is relu(b) = 0), half a positive one.
    """
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.uniform(-1, 1, beta.shape),
                               rng.uniform(-1, 1, mean.shape), rng.uniform(0.5, 2, var.shape)])
            continue
        if not isinstance(layer, (L.Dense, L.Conv2D, SparseDense)):
            continue
        if isinstance(layer, SparseDense):
            kernel = layer.to_scipy().toarray()
        else:
            kernel = layer.kernel.numpy()
        filters, channels = kernel.shape[-1], kernel.shape[-2]
        zero_filters = rng.choice(filters, filters // 3, replace=False)
        if layer is not model.layers[-1]:
            kernel[..., zero_filters] = 0
        kernel[..., rng.choice(channels, channels // 5, replace=False), :] = 0
        if isinstance(layer, SparseDense):
            layer.values.assign(kernel[layer.pattern.rows, layer.pattern.cols])
        else:
            layer.kernel.assign(kernel)
        if layer.use_bias:
            bias = rng.uniform(0.1, 0.5, filters) * rng.choice([-1, 1], filters)
            layer.bias.assign(bias.astype(np.float32))


def compacted_pair(name, seed=0):
    keras.utils.set_random_seed(seed)
    model = MODELS[name]()
    randomize(model, np.random.default_rng(seed))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = fssl.compact(model)
    return model, small, caught


def weight_count(model):
    return sum(int(np.prod(w.shape)) for w in model.weights)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compacted_outputs_equal_the_original(name, seed):
    model, small, _ = compacted_pair(name, seed)
    x = np.random.default_rng(seed + 10).standard_normal(
        (6,) + model.input_shape[1:]).astype(np.float32)
    expected, got = model(x, training=False).numpy(), small(x, training=False).numpy()
    # float32, a different summation order and constants folded in float64:
    # each of the <= 8 layers sums <= 200 products, so the relative error per
    # layer stays below 200 * 2**-24 ~ 1.2e-5 of the magnitude summed; 1e-4 of
    # the output scale bounds 8 layers of it.
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale)
    assert weight_count(small) < weight_count(model)


@pytest.mark.parametrize("dense_threshold", [0.0, 1.0])
def test_functional_sparse_mlp_keeps_sparse_layers_below_the_threshold(dense_threshold):
    keras.utils.set_random_seed(0)
    model = mlp(True)
    randomize(model, np.random.default_rng(0))
    small = fssl.compact(model, dense_threshold=dense_threshold)
    rows = fssl.report(model, dense_threshold=dense_threshold, print_fn=None)
    after = "Dense" if dense_threshold == 0.0 else "SparseDense"
    assert isinstance(small.get_layer("h1"), SparseDense) == (after == "SparseDense")
    assert rows[0]["type"] == f"SparseDense -> {after}"
    assert rows[0]["nnz_after"] == int(np.count_nonzero(
        small.get_layer("h1").to_scipy().toarray() if after == "SparseDense"
        else small.get_layer("h1").kernel.numpy()))
    x = np.random.default_rng(1).standard_normal((5, 20)).astype(np.float32)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), atol=1e-5, rtol=0)


def test_vgg_removes_exactly_the_foldable_filters():
    model, small, _ = compacted_pair("vgg")
    kernel, bias = model.get_layer("c1").get_weights()
    reads = model.get_layer("c2").kernel.numpy()
    zero_filter = ~kernel.any(axis=(0, 1, 2))
    unread = ~reads.any(axis=(0, 1, 3))
    # A zero filter of c1 is the constant relu(bias); c2 is "same" 3x3 and can
    # fold it only when it is 0 (its zero padding would make any other
    # constant's contribution depend on the position). An unread filter goes.
    removed = unread | (zero_filter & (np.maximum(bias, 0) == 0))
    assert (zero_filter & (bias > 0) & ~unread).any()  # a constant that must stay
    assert small.get_layer("c1").filters == int((~removed).sum()) < 8
    assert small.get_layer("d1").units < 16


def test_residual_add_keeps_a_channel_unless_every_addend_loses_it():
    keras.utils.set_random_seed(0)
    model = resnet()
    b2 = model.get_layer("b2").kernel.numpy()
    b2[..., [1, 5]] = 0  # the block's branch loses channels 1 and 5 ...
    model.get_layer("b2").kernel.assign(b2)
    small = fssl.compact(model)
    assert small.get_layer("add").output.shape[-1] == 8  # ... the shortcut still carries them
    stem = model.get_layer("stem").kernel.numpy()
    stem[..., [5]] = 0  # now channel 5 is a constant in both addends, folded into "down"
    model.get_layer("stem").kernel.assign(stem)
    b1 = model.get_layer("b1").kernel.numpy()
    b1[:, :, 5, :] = 0  # and the block does not read it through a "same" 3x3
    model.get_layer("b1").kernel.assign(b1)
    small = fssl.compact(model)
    assert small.get_layer("add").output.shape[-1] == 7
    assert small.get_layer("stem_bn").get_weights()[0].shape == (7,)
    x = np.random.default_rng(3).standard_normal((4, 10, 10, 3)).astype(np.float32)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), atol=1e-5, rtol=0)


def test_concatenate_maps_removed_channels_to_its_inputs():
    keras.utils.set_random_seed(0)
    model = concatenated()
    after = model.get_layer("after").kernel.numpy()
    after[:, :, [0, 7], :] = 0  # channel 0 of branch a and channel 1 of branch b: unread
    model.get_layer("after").kernel.assign(after)
    small = fssl.compact(model)
    assert small.get_layer("a").filters == 5 and small.get_layer("b").filters == 4
    assert small.get_layer("after").kernel.shape[-2] == 9
    x = np.random.default_rng(4).standard_normal((3, 9, 9, 2)).astype(np.float32)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), atol=1e-5, rtol=0)


def test_lambda_is_left_intact_and_reported():
    model, small, caught = compacted_pair("lambda")
    assert fssl.intact_layers(model) == ["double"]
    assert any("left these layers intact" in str(w.message) and "double (Lambda)"
               in str(w.message) for w in caught)
    assert small.get_layer("c1").filters == 6  # every channel around the Lambda stays
    lines = []
    fssl.report(model, print_fn=lines.append)
    assert "left intact, every channel around them kept: double" in lines[0]


class Scale(L.Layer):
    """A custom layer compaction knows nothing about."""

    def call(self, inputs):
        return inputs * 3.0


def test_custom_layer_is_left_intact():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    x = L.Dense(5, "relu", name="h")(inputs)
    x = Scale(name="scale")(x)
    model = keras.Model(inputs, L.Dense(2, name="out")(x))
    kernel = model.get_layer("h").kernel.numpy()
    kernel[:, 0] = 0
    model.get_layer("h").kernel.assign(kernel)
    with pytest.warns(UserWarning, match="scale"):
        small = fssl.compact(model)
    assert small.get_layer("h").units == 5
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), atol=1e-6, rtol=0)


def test_sequential_cnn_goes_through_the_functional_path():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(6, 3, activation="relu"),
                              L.BatchNormalization(), L.Flatten(), L.Dense(3)])
    kernel = model.layers[0].kernel.numpy()
    kernel[..., :2] = 0
    model.layers[0].kernel.assign(kernel)
    small = fssl.compact(model)
    assert small.layers[1].filters == 4
    x = np.random.default_rng(6).standard_normal((2, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), atol=1e-5, rtol=0)


def test_report_counts_conv_multiply_adds():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2))
    x = L.Conv2D(4, 3, activation="relu", name="c")(inputs)  # 4x4 output positions
    model = keras.Model(inputs, L.Conv2D(3, 1, name="o")(x))
    kernel = model.get_layer("c").kernel.numpy()
    kernel[..., 0] = 0
    model.get_layer("c").kernel.assign(kernel)
    model.get_layer("c").bias.assign([-1.0, 0.5, 0.5, 0.5])  # relu(-1) = 0: removed
    rows = fssl.report(model, print_fn=None)
    assert rows[0]["type"] == "Conv2D -> Conv2D"
    assert rows[0]["shape_before"] == (3, 3, 2, 4) and rows[0]["shape_after"] == (3, 3, 2, 3)
    assert rows[0]["macs_before"] == 16 * 72 and rows[0]["macs_after"] == 16 * 54
    assert rows[0]["nnz_before"] == 54 and rows[0]["nnz_after"] == 54
    assert rows[1]["macs_before"] == 16 * 12 and rows[1]["macs_after"] == 16 * 9
    assert rows[2]["macs_removed"] == pytest.approx(1 - (16 * 63) / (16 * 84))


class Needy(L.Layer):
    """A custom layer whose constructor takes an object Keras cannot serialise."""

    def __init__(self, scaler, **kwargs):
        super().__init__(**kwargs)
        self.scaler = scaler

    def call(self, inputs):
        return inputs * self.scaler.factor


class Scaler:
    factor = 2.0


def test_custom_layer_that_cannot_be_rebuilt_is_a_clear_error():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, L.Dense(2)(Needy(Scaler(), name="needy")(inputs)))
    with pytest.raises(ValueError) as info:
        fssl.compact(model)
    assert str(info.value).startswith(
        "compact rebuilds every layer of the new model from its config. Received: layer "
        "'needy' of type Needy, whose get_config/from_config fails (")



def _unregistered_square(t):
    return t * t + 1.0


@pytest.mark.parametrize("activation", [lambda t: t * t + 1.0, _unregistered_square])
@pytest.mark.parametrize("kind", ["conv", "dense chain"])
def test_a_layer_whose_activation_cannot_be_rebuilt_is_a_clear_error(activation, kind):
    # The layer compact rebuilds (its kernel lost groups) has an activation
    # its config cannot restore: Keras's TypeError quoted the whole config.
    keras.utils.set_random_seed(0)
    if kind == "conv":
        inputs = keras.Input((6, 6, 3))
        hidden = L.Conv2D(5, 3, activation=activation, name="rebuilt")(
            L.Conv2D(4, 3, activation="relu")(inputs))
        model = keras.Model(inputs, L.Dense(2)(L.Flatten()(hidden)))
    else:
        model = keras.Sequential([keras.Input((6,)), L.Dense(5, activation="relu"),
                                  L.Dense(4, activation=activation, name="rebuilt"),
                                  L.Dense(2)])
    first = model.layers[1] if kind == "conv" else model.layers[0]
    kernel = first.kernel.numpy()
    kernel[..., :2] = 0  # two outputs gone: the next layer is rebuilt with fewer inputs
    first.kernel.assign(kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns that a lambda is serialized
        with pytest.raises(ValueError) as info:
            fssl.compact(model)
    message = str(info.value)
    assert message.startswith(
        "compact rebuilds every layer of the new model from its config. Received: layer "
        "'rebuilt' of type ")
    assert "register_keras_serializable" in message and len(message) < 700


class Doubled(L.Dense):
    """A Dense that computes otherwise: compact must not rebuild it as a Dense."""

    def call(self, inputs):
        return super().call(inputs) * 2.0 + 1.0


class Shifted(L.Conv2D):
    def call(self, inputs):
        return super().call(inputs) + 3.0


@pytest.mark.parametrize("form", ["functional", "sequential", "conv"])
def test_subclasses_of_keras_layers_are_left_intact(form):
    # Before, a subclass was compacted as the Keras layer it extends (its
    # zero unit folded to activation(bias)): outputs off by 25%, silently.
    keras.utils.set_random_seed(0)
    if form == "conv":
        inputs = keras.Input((5, 5, 2))
        model = keras.Model(inputs, L.Conv2D(2, 1)(Shifted(3, 3, name="custom")(inputs)))
        x = np.random.default_rng(0).standard_normal((4, 5, 5, 2)).astype(np.float32)
    else:
        layers = [Doubled(3, activation="relu", name="custom"), L.Dense(2)]
        if form == "sequential":
            model = keras.Sequential([keras.Input((4,)), *layers])
        else:
            inputs = keras.Input((4,))
            model = keras.Model(inputs, layers[1](layers[0](inputs)))
        x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    custom = model.get_layer("custom")
    kernel, bias = custom.get_weights()
    kernel[..., 0] = 0.0
    bias[0] = 0.5
    custom.set_weights([kernel, bias])
    with pytest.warns(UserWarning, match=r"left these layers intact.*custom \((Doubled|Shifted)\)"):
        small = fssl.compact(model)
    assert type(small.get_layer("custom")) is type(custom)
    np.testing.assert_allclose(small(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


def test_a_nested_model_is_a_clear_error():
    inputs = keras.Input((3,))
    inner = keras.Sequential([keras.Input((4,)), L.Dense(4)], name="inner")
    model = keras.Model(inputs, L.Dense(2)(inner(L.Dense(4)(inputs))))
    for function in (fssl.compact, fssl.report):
        with pytest.raises(ValueError, match="Received: layer 'inner' of type Sequential, a model "
                                             "nested in"):
            function(model)


def test_compacted_cnn_saves_and_serves(tmp_path):
    model, small, _ = compacted_pair("resnet")
    x = np.random.default_rng(7).standard_normal((3, 10, 10, 3)).astype(np.float32)
    path = str(tmp_path / "small.keras")
    small.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(x).numpy(), model(x).numpy(),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: keras.Sequential([L.Dense(2)], name="lazy"),
         'Received an invalid value for "model", expected a built tf_keras Sequential model '
         "(give it an Input or call it once). Received: the unbuilt model 'lazy'"),
        (lambda: _shared(),
         "compact supports layers called once in the model. Received: layer 'twice' of "
         "type Dense, which is shared"),
    ],
)
def test_unsupported_models_are_clear_errors(make, message):
    with pytest.raises(ValueError) as info:
        fssl.compact(make())
    assert str(info.value).startswith(message)


def _shared():
    inputs = keras.Input((3,))
    dense = L.Dense(3, name="twice")
    return keras.Model(inputs, dense(dense(inputs)))


def test_drop_inputs_is_for_chains_only():
    with pytest.raises(ValueError) as info:
        fssl.compact(mlp(False), drop_inputs=True)
    assert str(info.value) == (
        'Received an invalid value for "drop_inputs", expected False for a model that is '
        "not a Sequential chain of Dense/SparseDense layers. Received: drop_inputs=True")


def test_every_channel_removed_is_a_clear_error():
    inputs = keras.Input((6, 6, 1))
    x = L.Conv2D(3, 3, name="first")(inputs)
    model = keras.Model(inputs, L.Conv2D(2, 1, name="second")(x))
    model.get_layer("first").kernel.assign(tf.zeros_like(model.get_layer("first").kernel))
    with pytest.raises(ValueError) as info:
        fssl.compact(model)  # "second" would read nothing but folded constants
    assert str(info.value) == (
        "Cannot compact: every input channel of layer 'second' would be removed (none that "
        "still varies reaches a channel the outputs depend on), which would leave an empty "
        "layer; train with a weaker group penalty or a lower threshold.")


def test_a_sparse_layer_left_without_a_nonzero_becomes_a_dense_of_zeros():
    # Its one input is a folded constant: the SparseDense would have an empty
    # pattern, which was an error about a "pattern" the user never passed.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = L.Dense(3, activation="relu", name="hidden")(inputs)
    pattern = np.zeros((3, 1), np.float32)
    pattern[0, 0] = 0.7
    outputs = [SparseDense(1, pattern=scipy.sparse.csr_matrix(pattern), name="sd")(hidden),
               L.Dense(2)(hidden)]
    model = keras.Model(inputs, outputs)
    kernel, bias = model.get_layer("hidden").get_weights()
    kernel[:, 0], bias[0] = 0.0, 0.5  # unit 0 is the constant relu(0.5)
    model.get_layer("hidden").set_weights([kernel, bias])
    small = fssl.compact(model)
    assert type(small.get_layer("sd")) is L.Dense
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for got, want in zip(small(x), model(x)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_report_does_not_count_positions_it_does_not_know():
    # On inputs of open size (None, None, 3) a convolution's positions were
    # counted as 1: 108 "multiply-adds per sample" for a 3x3x3x4 kernel.
    def cnn(size):
        inputs = keras.Input((size, size, 3))
        return keras.Model(inputs, L.Conv2D(2, 1)(L.Conv2D(4, 3)(inputs)))

    rows = fssl.report(cnn(None), print_fn=None)
    assert rows[0]["macs_before"] is None and rows[0]["macs_removed"] is None
    assert rows[-1]["macs_before"] is None
    assert rows[0]["nnz_before"] == 3 * 3 * 3 * 4
    assert fssl.report(cnn(6), print_fn=None)[0]["macs_before"] == 4 * 4 * 108


def test_inputs_and_outputs_keep_their_structure():
    # A dict of outputs came back as a list in sorted-key order, so code
    # unpacking it as built ("z" first) silently took the other output.
    image = keras.Input((6, 6, 2), name="image")
    side = keras.Input((3,), name="side")
    conv = L.Conv2D(4, 3, activation="relu")(image)
    pooled = L.GlobalAveragePooling2D()(conv)
    head = L.Dense(5)(L.Concatenate()([pooled, side]))
    model = keras.Model({"side": side, "image": image}, {"z": head, "a": pooled})
    small = fssl.compact(model)
    rng = np.random.default_rng(0)
    x = {"image": rng.uniform(size=(2, 6, 6, 2)).astype("float32"),
         "side": rng.uniform(size=(2, 3)).astype("float32")}
    want, got = model(x), small(x)
    assert isinstance(got, dict) and set(got) == {"z", "a"}
    for key in ("z", "a"):
        np.testing.assert_allclose(got[key], want[key], atol=1e-5)
    lists = keras.Model([image, side], [head, pooled])  # a list stays in its order
    out = fssl.compact(lists)([x["image"], x["side"]])
    assert [tuple(t.shape) for t in out] == [(2, 5), (2, 4)]
