"""distribute(): the model checks that need no running Horovod job."""

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
