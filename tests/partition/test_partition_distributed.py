"""distribute(): the model checks that need no running Horovod job."""

import numpy as np
import pytest
import scipy.sparse

from tfsparse._keras import keras
from tfsparse.layers import SparseDense

pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed")

from tfsparse.partition import distribute  # noqa: E402
from tfsparse.partition import partition_rows  # noqa: E402

# The model is checked before the partition (which fits its first layer).
PART = partition_rows([scipy.sparse.random(8, 6, density=0.5, random_state=0)], 2)


def refusal(model):
    with pytest.raises(ValueError) as error:
        distribute(model, PART)
    return str(error.value)


@pytest.mark.parametrize("second,reason", [
    (lambda: keras.layers.Dense(4, name="dense_x"),
     "layer 'dense_x': it is a Dense, not a SparseDense layer"),
    (lambda: keras.layers.Dropout(0.5, name="dropout_x"),
     "layer 'dropout_x': it is a Dropout, not a SparseDense layer"),
    (lambda: SparseDense(4, density=0.5, kernel_regularizer="l2", name="sparse_x"),
     "layer 'sparse_x': its kernel_regularizer is set"),
])
def test_layers_it_cannot_partition_are_refused(second, reason):
    model = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5), second()])
    assert refusal(model) == (
        'Received an invalid value for "model", expected a chain of SparseDense layers on '
        f"2-D inputs without regularizers or constraints. Received: {reason}")


def test_a_softmax_before_the_last_layer_is_refused():
    model = keras.Sequential([keras.Input((8,)),
                              SparseDense(6, density=0.5, activation="softmax", name="soft"),
                              SparseDense(4, density=0.5)])
    assert refusal(model) == (
        'Received an invalid value for "model", expected an activation that acts on each '
        "neuron alone in every layer but the last (whose activation, such as softmax, is "
        "applied after the outputs are gathered). Received: layer 'soft' with activation "
        "softmax")


def test_relabelled_owners_have_another_digest():
    # The digest before (the sum of owner x position) was 5 for both.
    from tfsparse.partition.distributed import owners_digest

    assert owners_digest([np.array([0, 1, 1, 0])]) != owners_digest([np.array([1, 0, 0, 1])])
    assert owners_digest([np.array([0, 1])]) == owners_digest([np.array([0, 1])])


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.first, self.second = SparseDense(6, density=0.5), SparseDense(4, density=0.5)

    def call(self, x):
        return self.second(2.0 * self.first(x))


def twice():
    inputs = keras.Input((8,))
    layer = SparseDense(8, density=0.5)
    return keras.Model(inputs, layer(layer(inputs)))


def two_outputs():
    inputs = keras.Input((8,))
    hidden = SparseDense(6, density=0.5)(inputs)
    return keras.Model(inputs, [SparseDense(4, density=0.5)(hidden), hidden])


@pytest.mark.parametrize("make", [twice, two_outputs, Subclassed], ids=lambda f: f.__name__)
def test_a_model_that_is_not_a_chain_is_refused(make):
    # Before: accepted and run as a chain of its layers (1.5 to 4.1 off, or
    # the second output dropped).
    model = make()
    model(np.ones((1, 8), np.float32))
    assert "expected a chain of single-input layers" in refusal(model)


def test_unbuilt_and_non_float32_models_are_refused():
    unbuilt = keras.Sequential([SparseDense(6, density=0.5)])
    assert "expected a built model" in refusal(unbuilt)  # was an AttributeError
    wide = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5, dtype="float64")])
    assert "float64" in refusal(wide)  # was a dtype conversion error
    mixed = keras.Sequential([keras.Input((8,)),
                              SparseDense(6, density=0.5, dtype="mixed_float16")])
    assert "'mixed_float16'" in refusal(mixed)  # computed in float32, silently
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5,
                                                                 dtype="float32")])
        assert "global policy 'mixed_float16'" in refusal(model)
    finally:
        keras.mixed_precision.set_global_policy("float32")
