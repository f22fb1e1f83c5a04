import numpy as np
import pytest
import tensorflow_model_optimization as tfmot

from tfsparse._keras import keras
from tfsparse.layers import SparseDense
from tfsparse.layers import sparsify


def _mlp():
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    outputs = keras.layers.Dense(4, activation="softmax", name="out")(hidden)
    return keras.Model(inputs, outputs)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 20)).astype(np.float32)
    y = (x[:, :4] > 0).argmax(axis=1)
    return x, y


def _assert_same_outputs(a, b, x):
    # Same products summed in another order: float32 rounding of sums of <= 32
    # terms of magnitude O(1) stays far below 1e-5.
    np.testing.assert_allclose(a.predict(x, verbose=0), b.predict(x, verbose=0), atol=1e-5)


def test_sparsify_keeps_exactly_the_nonzero_weights():
    model = _mlp()
    kernel, bias = model.get_layer("hidden").get_weights()
    kernel[np.abs(kernel) < 0.2] = 0
    model.get_layer("hidden").set_weights([kernel, bias])
    sparse = sparsify(model)
    hidden = sparse.get_layer("hidden")
    assert isinstance(hidden, SparseDense)
    assert hidden.nnz == np.count_nonzero(kernel)
    np.testing.assert_array_equal(hidden.to_scipy().toarray(), kernel)
    assert hidden.activation is keras.activations.relu
    assert isinstance(sparse.get_layer("out"), SparseDense)
    _assert_same_outputs(model, sparse, _data()[0])


def test_max_density_keeps_dense_layers_dense():
    model = _mlp()
    kernel, bias = model.get_layer("hidden").get_weights()
    kernel[:, ::2] = 0
    model.get_layer("hidden").set_weights([kernel, bias])
    sparse = sparsify(model, max_density=0.6)
    assert isinstance(sparse.get_layer("hidden"), SparseDense)
    assert type(sparse.get_layer("out")) is keras.layers.Dense
    _assert_same_outputs(model, sparse, _data()[0])


def test_tfmot_pruned_model_becomes_sparse_with_equal_outputs():
    x, y = _data()
    schedule = tfmot.sparsity.keras.ConstantSparsity(0.8, begin_step=0, frequency=1)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(_mlp(), pruning_schedule=schedule)
    pruned.compile("adam", "sparse_categorical_crossentropy")
    pruned.fit(x, y, epochs=2, batch_size=64, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    with pytest.raises(ValueError, match="strip_pruning"):
        sparsify(pruned)
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    sparse = sparsify(stripped)
    hidden = sparse.get_layer("hidden")
    assert hidden.density == pytest.approx(0.2, abs=0.01)
    _assert_same_outputs(stripped, sparse, x)
    sparse.compile("adam", "sparse_categorical_crossentropy")
    sparse.fit(x, y, epochs=1, verbose=0)  # the sparse model keeps training


def test_sparsify_rejects_what_it_cannot_convert():
    with pytest.raises(ValueError, match='"model", expected a tf_keras Model'):
        sparsify("model")
    with pytest.raises(ValueError, match='"max_density"'):
        sparsify(_mlp(), max_density=0)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4)

        def call(self, inputs):
            return self.hidden(inputs)

    subclassed = Subclassed()
    subclassed(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError) as error:
        sparsify(subclassed)
    assert str(error.value) == (
        'Received an invalid value for "model", expected a Sequential or functional '
        "model (a subclassed model's layers cannot be rewired: build it with SparseDense "
        "layers instead). Received: model of class Subclassed")


def test_functional_model_with_a_branch_converts_with_equal_outputs():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    branch = keras.layers.Dense(8)(hidden)
    outputs = keras.layers.Dense(3)(keras.layers.Add()([hidden, branch]))
    model = keras.Model(inputs, outputs)
    sparse = sparsify(model)
    assert [type(layer).__name__ for layer in sparse.layers] == [
        "InputLayer", "SparseDense", "SparseDense", "Add", "SparseDense"]
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    # Dense weights are all nonzero: the same products in another order.
    np.testing.assert_allclose(sparse.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-5)


class Sub(keras.Model):
    """A subclassed model whose config does not keep its name: its copy gets another."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d = keras.layers.Dense(3)

    def call(self, inputs):
        return self.d(inputs)

    def get_config(self):
        return {}


def test_a_nested_subclassed_model_is_copied_with_its_weights():
    # The weights were set by name: "No such layer: sub".
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, Sub()(inputs))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    sparse = sparsify(model)
    np.testing.assert_allclose(sparse(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
