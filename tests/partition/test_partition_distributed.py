"""distribute(): the model checks that need no running Horovod job."""

import pytest

from tfsparse._keras import keras
from tfsparse.layers import SparseDense

pytest.importorskip("horovod.tensorflow", reason="Horovod is not installed")

from tfsparse.partition import distribute  # noqa: E402
from tfsparse.partition import partition_rows  # noqa: E402


def test_models_with_other_layers_or_regularizers_are_refused():
    dense = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5),
                              keras.layers.Dense(4)])
    part = partition_rows([layer.to_scipy() for layer in dense.layers[:1]], 2)
    with pytest.raises(ValueError) as error:
        distribute(dense, part)
    assert "Received: layer 'dense" in str(error.value)
    assert "of type Dense" in str(error.value)
    dropout = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5),
                                keras.layers.Dropout(0.5)])
    with pytest.raises(ValueError, match="of type Dropout"):
        distribute(dropout, part)
    regularized = keras.Sequential([
        keras.Input((8,)),
        SparseDense(6, density=0.5, kernel_regularizer="l2")])
    with pytest.raises(ValueError, match="with kernel_regularizer"):
        distribute(regularized, part)
