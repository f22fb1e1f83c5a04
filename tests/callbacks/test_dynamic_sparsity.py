"""callbacks.DynamicSparsity in model.fit: schedule, saving, resuming, refusals."""

import pathlib
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

from callbacks import DynamicSparsity
from tfsparse._keras import keras
from tfsparse.dynamic import drop_fraction_at
from tfsparse.dynamic import selection
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "layers"))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "dynamic"))
from layer_contract import serve_in_fresh_process  # noqa: E402
from rigl_reference import conv_patches  # noqa: E402
from rigl_reference import reference_update  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 12)).astype(np.float32)
Y = (X[:, :3] @ RNG.standard_normal((3, 4))).astype(np.float32)
IMAGES = RNG.standard_normal((64, 8, 8, 2)).astype(np.float32)  # the CNN's inputs, Y its targets


def _model(seed=0, optimizer="adam"):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((12,)),
        SparseDense(16, density=0.25, seed=seed, activation="relu", name="hidden"),
        SparseDense(4, density=0.5, seed=seed + 1, name="out"),
    ])
    model.compile(optimizer, "mse")
    return model


def _cnn(seed=0):
    """SparseConv2D (same) -> SparseConv2D (stride 2, dilation-free valid) -> SparseDense."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 2)),
        SparseConv2D(6, 3, padding="same", density=0.3, seed=seed, activation="relu",
                     name="conv1"),
        SparseConv2D(4, 3, strides=2, density=0.3, seed=seed + 1, activation="relu",
                     name="conv2"),
        keras.layers.Flatten(),
        SparseDense(4, density=0.3, seed=seed + 2, name="out"),
    ])
    model.compile("adam", "mse")
    return model


def _patterns(model):
    return [layer.pattern for layer in model.layers if hasattr(layer, "pattern")]


@pytest.mark.parametrize("method", ["rigl", "set"])
def test_updates_follow_the_schedule_and_keep_nnz(method):
    model = _model()
    before = _patterns(model)
    nnz = [layer.nnz for layer in model.layers]
    callback = DynamicSparsity(method, update_every=3, drop_fraction=0.5, end_step=0.5, seed=1)
    model.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[callback])
    end = int(0.5 * 8 * 3)  # 24 steps of training
    assert [u["step"] for u in callback.updates] == [3, 6, 9]
    for update in callback.updates:
        assert update["drop_fraction"] == drop_fraction_at(update["step"], 0.5, end)
    assert [layer.nnz for layer in model.layers] == nnz
    assert any(a != b for a, b in zip(before, _patterns(model)))
    # Each layer moved floor(f * nnz) positions at most (some dropped weights regrow).
    for update in callback.updates:
        for layer, count in zip(model.layers, nnz):
            assert 0 <= update["moved"][layer.name] <= int(update["drop_fraction"] * count)
    dense = [(layer.to_scipy().toarray(), layer.bias.numpy()) for layer in model.layers]
    hidden = np.maximum(X @ dense[0][0] + dense[0][1], 0)
    # float32 sums of <= 16 O(1) products: 1e-4 absolute is far above rounding.
    np.testing.assert_allclose(model.predict(X, verbose=0), hidden @ dense[1][0] + dense[1][1],
                               atol=1e-4)


class _HalfSquares(keras.Model):
    """A user's own train_step and loss: 0.5 * sum((z - y)^2), so dz = z - y."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_sum(tf.square(self(x, training=True) - y))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def _one_layer_model(case, learning_rate):
    keras.utils.set_random_seed(0)
    layer = SparseDense(6, density=0.5, seed=4, name="layer")
    inputs = keras.Input((12,), name="features")
    kind = {"custom_train_step": _HalfSquares}.get(case, keras.Model)
    model = kind({"features": inputs} if case == "dict_inputs" else inputs, layer(inputs))
    model.compile(keras.optimizers.SGD(learning_rate), "mse",
                  steps_per_execution=2 if case == "steps_per_execution" else 1)
    return model, layer


def _fit_arguments(case, x, y, weights):
    if case == "dataset_sample_weights":  # tf.data, and weights in the step's loss
        return dict(x=tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(8))
    if case == "dict_inputs":
        return dict(x={"features": x}, y=y, batch_size=8, shuffle=False)
    return dict(x=x, y=y, batch_size=8, shuffle=False)


def _step_gradient(case, x, y, weights, kernel, bias):
    """d loss / d W of one batch: Keras's mse is mean_b(w_b mean_u (z - y)^2)."""
    z = x.astype(np.float64) @ kernel + bias
    if case == "custom_train_step":
        dz = z - y
    else:
        dz = weights[:, None] * 2 * (z - y) / (z.shape[0] * z.shape[1])
    return x.T.astype(np.float64) @ dz


class _StateAround(keras.callbacks.Callback):
    """Listed before DynamicSparsity: the layer before step ``step`` and after it."""

    def __init__(self, layer, step):
        super().__init__()
        self.layer, self.step = layer, step

    def on_train_begin(self, logs=None):
        self.keras_train_function = self.model.train_function  # before DynamicSparsity's

    def on_train_batch_begin(self, batch, logs=None):
        # The last begin at or before the step (an execution of 2 begins 2 before).
        if self.step - 2 <= int(self.model.optimizer.iterations.numpy()) < self.step:
            self.kernel = self.layer.to_scipy().toarray()
            self.bias = self.layer.bias.numpy()

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            pattern = self.layer.pattern
            self.keys = selection.keys_of(pattern.rows, pattern.cols, self.layer.input_dim)
            self.values = self.layer.values.numpy()


@pytest.mark.parametrize("case", ["numpy", "dataset_sample_weights", "dict_inputs",
                                  "custom_train_step", "steps_per_execution"])
def test_rigl_grows_where_the_gradient_of_the_trained_batch_is_largest(case):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 12)).astype(np.float32)  # 8 batches that differ
    y = rng.standard_normal((64, 6)).astype(np.float32)
    weights = (rng.uniform(0.1, 2.0, 64) if case == "dataset_sample_weights"
               else np.ones(64)).astype(np.float32)
    # Steps per execution 2: the weights before an execution's last step are
    # not observable, so SGD does not move them (lr 0); the batch still decides.
    learning_rate = 0.0 if case == "steps_per_execution" else 0.1
    step = 4 if case == "steps_per_execution" else 3
    model, layer = _one_layer_model(case, learning_rate)
    around = _StateAround(layer, step)
    rigl = DynamicSparsity("rigl", update_every=step, drop_fraction=0.5, decay="constant",
                           end_step=step + 1)
    model.fit(**_fit_arguments(case, x, y, weights), epochs=1, verbose=0,
              callbacks=[around, rigl])
    assert [u["step"] for u in rigl.updates] == [step]

    def expected_keys(batch):
        rows = slice(8 * batch, 8 * batch + 8)
        gradient = _step_gradient(case, x[rows], y[rows], weights[rows], around.kernel,
                                  around.bias)
        count = int(0.5 * layer.nnz)
        return reference_update(around.keys, around.values, [], np.abs(gradient.T.ravel()),
                                count, layer.input_dim * layer.units)[0]

    keys = selection.keys_of(layer.pattern.rows, layer.pattern.cols, layer.input_dim)
    np.testing.assert_array_equal(keys, expected_keys(step - 1))  # the step's own batch
    assert not np.array_equal(keys, expected_keys(step - 2))  # another batch would differ
    # fit leaves the model as it found it.
    assert "train_step" not in vars(model) and layer._gradient_probe is None
    assert model.train_function is around.keras_train_function


def test_the_step_is_traced_once_per_compiled_model():
    model = _model()
    rigl = DynamicSparsity("rigl", update_every=3, end_step=100, seed=0)
    used = []
    record = keras.callbacks.LambdaCallback(  # listed after DynamicSparsity
        on_train_batch_begin=lambda batch, logs: used.append(model.train_function))

    def fit():
        used.clear()
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[rigl, record])
        return used[0]

    first = fit()
    assert fit() is first  # fit per epoch: no new trace for the same compiled model
    assert [update["step"] for update in rigl.updates] == [9, 12, 15]  # the second fit's
    assert model.train_function is not first  # Keras's own, between fits
    model.compile("adam", "mse")  # a new loss or optimizer: a new step
    assert fit() is not first


def test_layers_argument_limits_the_update():
    model = _model()
    out_before = model.layers[1].pattern
    callback = DynamicSparsity("set", update_every=2, layers=["hidden"], seed=0)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert model.layers[1].pattern == out_before
    assert list(callback.updates[0]["moved"]) == ["hidden"]



@pytest.mark.parametrize("method", ["set", "rigl"])
def test_frozen_layers_keep_their_pattern_and_weights(method):
    # A frozen (trainable=False) SparseConv2D before trainable layers, as in
    # transfer learning: its dropped weights would be lost and its grown
    # positions never train, so layers=None leaves it as it is.
    model = _cnn()
    conv = model.layers[0]
    conv.trainable = False
    model.compile("adam", "mse")
    x = np.random.default_rng(5).random((32, 8, 8, 2), "float32")
    y = np.random.default_rng(6).random((32, model.output_shape[-1]), "float32")
    weights = [w.numpy().copy() for w in conv.weights]
    callback = DynamicSparsity(method, update_every=2, drop_fraction=0.5, end_step=100)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert callback.updates and all(conv.name not in u["moved"] for u in callback.updates)
    for before, after in zip(weights, conv.weights):
        np.testing.assert_array_equal(after.numpy(), before)
    frozen = re.escape(f"trainable=False layers {[conv.name]}")
    with pytest.raises(ValueError, match=f'"layers".*{frozen}'):
        model.fit(x, y, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity(method, layers=[conv.name])])
    model.trainable = False
    model.compile("adam", "mse")
    with pytest.raises(ValueError, match="no trainable SparseDense or SparseConv2D layer"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[DynamicSparsity(method)])


def _fit_with_backup(model, backup_dir, epochs, stop_after=None, x=X):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if stop_after is not None and epoch + 1 == stop_after:
                raise RuntimeError("interrupted")

    callbacks = [DynamicSparsity("rigl", update_every=5, seed=2),
                 keras.callbacks.BackupAndRestore(str(backup_dir)), Interrupt()]
    model.fit(x, Y, batch_size=8, epochs=epochs, verbose=0, shuffle=False,
              callbacks=callbacks)


@pytest.mark.parametrize("build, x", [(_model, X), (_cnn, IMAGES)], ids=["mlp", "cnn"])
def test_backup_and_restore_resumes_bit_identically(tmp_path, build, x):
    uninterrupted = build(seed=3)
    _fit_with_backup(uninterrupted, tmp_path / "a", epochs=4, x=x)
    interrupted = build(seed=3)
    with pytest.raises(RuntimeError, match="interrupted"):
        _fit_with_backup(interrupted, tmp_path / "b", epochs=4, stop_after=2, x=x)
    resumed = build(seed=3)  # a new process would build the model anew
    _fit_with_backup(resumed, tmp_path / "b", epochs=4, x=x)
    assert _patterns(resumed) == _patterns(uninterrupted)
    for a, b in zip(resumed.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed.optimizer.variables, uninterrupted.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("build, x", [(_model, X), (_cnn, IMAGES)], ids=["mlp", "cnn"])
@pytest.mark.parametrize("method", ["rigl", "set"])
def test_moved_pattern_survives_keras_format_clone_and_saved_model(tmp_path, method, build, x):
    model = build()
    model.fit(x, Y, batch_size=8, epochs=2, verbose=0, callbacks=[
        DynamicSparsity(method, update_every=4, drop_fraction=0.5, seed=0)])
    moved = _patterns(model)
    assert all(a != b for a, b in zip(moved, _patterns(build())))  # every layer moved
    expected = model.predict(x, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert _patterns(loaded) == moved
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)
    # A clone is the same network (pattern), with fresh values, as for Dense.
    assert _patterns(keras.models.clone_model(model)) == moved
    model.save(tmp_path / "saved_model", save_format="tf")
    # Served by TensorFlow's CSR ops (no tfsparse there), which sum in another
    # order than the compiled kernels: float32 sums of <= 54 O(1) terms agree
    # to a few ulps, far inside 1e-5; a stale pattern would differ by O(0.1).
    np.testing.assert_allclose(
        serve_in_fresh_process(tmp_path / "saved_model", x, tmp_path), expected, atol=1e-5)


def _message(name, expected, received):
    return (f'Received an invalid value for "{name}", expected {expected}. '
            f"Received: {name}={received}")


def test_invalid_arguments_are_all_reported():
    with pytest.raises(ValueError) as error:
        DynamicSparsity("snip", update_every=0, drop_fraction=1.5, decay="step",
                        end_step=0, seed=None)
    assert str(error.value).split("\n") == [
        _message("method", "one of ('rigl', 'set')", "'snip'"),
        _message("update_every", "an integer >= 1", "0"),
        _message("drop_fraction", "a float in (0, 1]", "1.5"),
        _message("decay", "one of ('cosine', 'constant', 'linear')", "'step'"),
        _message("end_step", "an integer >= 1 or a float in (0, 1]", "0"),
        _message("seed", "a non-negative integer", "None"),
    ]


@pytest.mark.parametrize("argument,value", [
    # Before: NumPy's error at the first SET update, a TypeError at the first
    # RigL update, 0 silently the default, -5 silently one column a block,
    # any verbose, 5 a TypeError at fit, [] an error not naming layers.
    ("seed", -1), ("block_elements", "big"), ("block_elements", 2500.0),
    ("block_elements", 0), ("block_elements", -5), ("verbose", "yes"), ("verbose", 7),
    ("layers", 5), ("layers", []), ("layers", "dense"),
])
def test_each_argument_is_checked_when_made(argument, value):
    with pytest.raises(ValueError, match=f'"{argument}"'):
        DynamicSparsity("set", **{argument: value})


def test_a_fractional_end_step_that_moves_between_fits_is_refused():
    # Before: 4 x fit(epochs=1) made one update (0.75 x 8 steps of each call)
    # against fit(epochs=4)'s five; fit(epochs=2) then fit(initial_epoch=2,
    # epochs=4) skipped steps 12 and 16.
    model, callback = _model(), DynamicSparsity("set", update_every=4)
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    with pytest.raises(ValueError, match=r'"end_step".*12 in an earlier fit, 24 in this one'):
        model.fit(X, Y, batch_size=8, initial_epoch=2, epochs=4, verbose=0,
                  callbacks=[callback])
    # A resume of the same length, with a new callback, is the same schedule.
    straight, resumed = _model(), _model()
    straight.fit(X, Y, batch_size=8, epochs=4, verbose=0, shuffle=False,
                 callbacks=[DynamicSparsity("set", update_every=4)])
    first = DynamicSparsity("set", update_every=4, end_step=24)
    resumed.fit(X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[first])
    again = DynamicSparsity("set", update_every=4)
    resumed.fit(X, Y, batch_size=8, initial_epoch=2, epochs=4, verbose=0, shuffle=False,
                callbacks=[again])
    assert [u["step"] for u in first.updates + again.updates] == [4, 8, 12, 16, 20]
    for a, b in zip(straight.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


class _Invariants(keras.callbacks.Callback):
    """Listed after DynamicSparsity: checks every layer's pattern after every step."""

    def __init__(self, layers):
        super().__init__()
        self.layers, self.moves = layers, 0

    def on_train_begin(self, logs=None):
        self.nnz = [layer.nnz for layer in self.layers]
        self.last = _keys_of(self.layers)

    def on_train_batch_end(self, batch, logs=None):
        keys = _keys_of(self.layers)
        for layer, nnz, layer_keys in zip(self.layers, self.nnz, keys):
            assert layer.nnz == nnz and layer_keys.size == nnz
            assert np.all(np.diff(layer_keys) > 0)  # column-major sorted, no repeats
            assert layer_keys[-1] < np.prod(layer.pattern.shape)
        self.moves += sum(not np.array_equal(a, b) for a, b in zip(self.last, keys))
        self.last = keys


def _keys_of(layers):
    return [selection.keys_of(layer.pattern_rows.numpy(), layer.pattern_cols.numpy(),
                              layer.pattern.shape[0]) for layer in layers]


def _cnn_outputs(model, x):
    """The CNN in NumPy from the layers' current sparse kernels."""
    conv1, conv2, _, out = model.layers
    hidden = np.maximum(np.einsum("bhwijc,ijcf->bhwf", conv_patches(
        x, (3, 3), (1, 1), "same", (1, 1)), conv1.to_dense()) + conv1.bias.numpy(), 0)
    hidden = np.maximum(np.einsum("bhwijc,ijcf->bhwf", conv_patches(
        hidden, (3, 3), (2, 2), "valid", (1, 1)), conv2.to_dense()) + conv2.bias.numpy(), 0)
    return hidden.reshape(len(x), -1) @ out.to_scipy().toarray() + out.bias.numpy()


@pytest.mark.parametrize("method", ["rigl", "set"])
def test_conv_and_dense_patterns_move_and_stay_valid_in_fit(method):
    model = _cnn()
    layers = [model.layers[i] for i in (0, 1, 3)]
    invariants = _Invariants(layers)
    callback = DynamicSparsity(method, update_every=2, drop_fraction=0.5, seed=1)
    model.fit(IMAGES, Y, batch_size=8, epochs=2, verbose=0, callbacks=[callback, invariants])
    assert [u["step"] for u in callback.updates] == [2, 4, 6, 8, 10]
    assert sorted(callback.updates[0]["moved"]) == ["conv1", "conv2", "out"]
    assert all(update["moved"]["conv1"] > 0 for update in callback.updates)
    assert invariants.moves >= 3 * len(callback.updates) - 1
    # The kernels compute with the moved patterns. float32 sums of <= 54 O(1)
    # products per layer, three layers: 1e-4 absolute is far above rounding.
    np.testing.assert_allclose(model.predict(IMAGES, verbose=0), _cnn_outputs(model, IMAGES),
                               atol=1e-4)


def test_rigl_grows_a_conv_where_the_step_gradient_is_largest():
    keras.utils.set_random_seed(0)
    layer = SparseConv2D(3, 3, strides=2, padding="same", dilation_rate=1, density=0.3,
                         seed=3, name="conv")
    model = keras.Sequential([keras.Input((8, 8, 2)), layer, keras.layers.Flatten()])
    model.compile(keras.optimizers.SGD(0.0), "mse")  # lr 0: the kernel stays the initial one
    keys, values = _keys_of([layer])[0], layer.values.numpy()
    y = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)
    rigl = DynamicSparsity("rigl", update_every=2, drop_fraction=0.5, decay="constant",
                           end_step=3)
    model.fit(IMAGES, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[rigl])
    assert [u["step"] for u in rigl.updates] == [2]
    kernel = np.zeros(9 * 2 * 3)
    kernel[keys] = values
    kernel = kernel.reshape(3, 9 * 2).T.reshape(3, 3, 2, 3)

    def expected_keys(batch):  # mse's gradient on a batch, by direct correlation in float64
        rows = slice(8 * batch, 8 * batch + 8)
        patches = conv_patches(IMAGES[rows].astype(np.float64), (3, 3), (2, 2), "same", (1, 1))
        z = np.einsum("bhwijc,ijcf->bhwf", patches, kernel) + layer.bias.numpy()
        dz = 2 * (z - y[rows].reshape(z.shape)) / z.size
        gradient = np.einsum("bhwijc,bhwf->ijcf", patches, dz).reshape(-1, 3)
        return reference_update(keys, values, [], np.abs(gradient.T.ravel()),
                                int(0.5 * layer.nnz), gradient.size)[0]

    np.testing.assert_array_equal(_keys_of([layer])[0], expected_keys(1))  # the step's own
    assert not np.array_equal(_keys_of([layer])[0], expected_keys(0))  # another would differ
    assert "train_step" not in vars(model) and layer._gradient_probe is None


def test_misuse_is_refused_with_a_clear_error():
    model = _model()
    with pytest.raises(ValueError, match='"layers"'):
        model.fit(X, Y, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity("set", layers=["nope"])])
    dense = keras.Sequential([keras.Input((12,)), keras.layers.Dense(4)])
    dense.compile("adam", "mse")
    with pytest.raises(ValueError, match="no trainable SparseDense or SparseConv2D layer"):
        dense.fit(X, Y, epochs=1, verbose=0, callbacks=[DynamicSparsity("set")])
    model.compile("adam", "mse", jit_compile=True)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity("rigl", update_every=2)])
    model.compile("adam", "mse", steps_per_execution=2)
    with pytest.raises(ValueError, match="update step 3 fell inside one"):
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity("set", update_every=3)])

    class ForwardOnly(keras.Sequential):  # a train_step that never differentiates
        def train_step(self, data):
            self.optimizer.iterations.assign_add(1)
            return {"loss": tf.reduce_mean(self(data[0], training=True))}

    forward_only = ForwardOnly(_model().layers)
    forward_only.compile("adam", "mse")
    with pytest.raises(RuntimeError, match="did not backpropagate through hidden"):
        forward_only.fit(X, Y, batch_size=8, epochs=1, verbose=0,
                         callbacks=[DynamicSparsity("rigl", update_every=2)])
    inputs = keras.Input((12,))
    shared = SparseDense(12, density=0.25, seed=0, name="shared")
    twice = keras.Model(inputs, shared(shared(inputs)))
    twice.compile("adam", "mse")
    with pytest.raises(NotImplementedError, match="shared was differentiated 2 times"):
        twice.fit(X, X, batch_size=8, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity("rigl", update_every=2)])


def test_pipelined_model_is_refused():
    from tfsparse.distribute import PipelineStrategy

    strategy = PipelineStrategy(devices=["/cpu:0"], num_microbatches=2)
    model = _model()
    strategy.attach(model)
    with pytest.raises(ValueError, match="PipelineStrategy"):
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[DynamicSparsity("set", update_every=2)])


def test_partitioned_model_is_refused():
    hvd = pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed")
    from tfsparse.partition import distribute
    from tfsparse.partition import partition_rows

    hvd.init()
    model = _model()
    part = partition_rows([layer.to_scipy() for layer in model.layers], hvd.size())
    distributed = distribute(model, part)
    distributed.compile("adam", "mse")
    with pytest.raises(ValueError, match="row-partitioned model"):
        distributed.fit(X, Y, batch_size=8, epochs=1, verbose=0,
                        callbacks=[DynamicSparsity("set", update_every=2)])


def test_an_optimizer_with_factored_state_is_refused_before_training():
    # Before: NotImplementedError at the first update, after update_every
    # steps of training.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), SparseDense(4, density=0.5)])
    model.compile(keras.optimizers.Adafactor(), "mse")
    callback = DynamicSparsity("set", update_every=2)
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    with pytest.raises(NotImplementedError, match="Adafactor keeps factored"):
        model.fit(np.ones((8, 6)), np.ones((8, 4)), batch_size=2, verbose=0,
                  callbacks=[callback, counter])
    assert steps == []


def test_rigl_skips_the_updates_of_steps_a_loss_scale_optimizer_skipped():
    # Under mixed_float16, a dynamic loss scale of 2**15 makes the scaled
    # gradients of targets of about 100 overflow in float16 at the first
    # steps: the optimizer skips those steps (and halves its scale); where
    # RigL's grow gradient is the overflowed one, it skips their updates and
    # updates at every other step (before, fit stopped with an error).
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _model()
    finally:
        keras.mixed_precision.set_global_policy(None)
    model.compile(keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam()), "mse")
    scales = []

    class Scales(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            scales.append(float(model.optimizer.loss_scale))

    rigl = DynamicSparsity("rigl", update_every=1, end_step=16)
    model.fit(X, 100 * Y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[Scales(), rigl])
    skipped = [step for step in range(1, len(scales)) if scales[step] < scales[step - 1]]
    # Steps 1-5 overflow in the layers' output gradients (RigL's too); later
    # ones may overflow elsewhere only (in a weight gradient x^T dz formed in
    # float16), where RigL's own inputs and output gradients stay finite and
    # rank the positions as well as unscaled ones: it updates there.
    assert rigl.skipped_steps and set(rigl.skipped_steps) <= set(skipped)
    assert [u["step"] for u in rigl.updates] == [
        s for s in range(1, 16) if s not in rigl.skipped_steps]
    for layer in model.layers:
        assert np.isfinite(layer.values.numpy()).all()


def _fssl_model():
    from tfsparse.regularizers import GroupLasso

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = SparseDense(32, density=0.5, seed=1, activation="relu", name="pruned",
                         kernel_regularizer=GroupLasso(0.3, groups="columns"))(inputs)
    model = keras.Model(inputs, SparseDense(1, density=0.5, seed=2, name="other")(hidden))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


@pytest.mark.parametrize("method", ["set", "rigl"])
def test_moving_a_layer_fssl_pruned_is_refused(method):
    # FSSL's masks are positions of the pattern it pruned. Before, a later
    # move kept them in place: they zeroed weights of columns FSSL kept after
    # every batch (8 of 256 here) and a removed column grew back (norm 0.015).
    from callbacks import FSSL

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16)).astype("float32")
    y = rng.standard_normal((64, 1)).astype("float32")
    fssl = FSSL(threshold=0.3, prune_epoch=2)  # prunes after step 8
    moving = DynamicSparsity(method, update_every=12, decay="constant", end_step=22,
                             layers=["pruned"])
    with pytest.raises(ValueError, match=r"cannot move the pattern of layer 'pruned': FSSL"):
        _fssl_model().fit(x, y, batch_size=16, epochs=6, verbose=0, callbacks=[fssl, moving])
    assert fssl.pruned_epoch == 1 and moving.updates == []
    # Moves that end before FSSL prunes, or of another layer, are fine.
    for layers, end_step in ((["pruned"], 8), (["other"], 22)):
        moving = DynamicSparsity(method, update_every=4, decay="constant", end_step=end_step,
                                 layers=layers)
        _fssl_model().fit(x, y, batch_size=16, epochs=6, verbose=0,
                          callbacks=[FSSL(threshold=0.3, prune_epoch=2), moving])
        assert moving.updates
    # Resumed after FSSL pruned, with no move left: before, refused all the same.
    model = _fssl_model()
    moving = DynamicSparsity(method, update_every=4, decay="constant", end_step=8,
                             layers=["pruned"])
    model.fit(x, y, batch_size=16, epochs=4, verbose=0,
              callbacks=[FSSL(threshold=0.3, prune_epoch=2), moving])
    again = DynamicSparsity(method, update_every=4, decay="constant", end_step=8,
                            layers=["pruned"])
    model.fit(x, y, batch_size=16, initial_epoch=4, epochs=6, verbose=0,
              callbacks=[FSSL(threshold=0.3, prune_epoch=2), again])
    assert again.updates == []
