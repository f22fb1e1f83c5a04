"""Per-layer pipeline costs: the cost model, the profiler, the layer chain."""

import numpy as np
import pytest

import tfsparse
from tfsparse import keras
from tfsparse.distribute import model_costs
from tfsparse.distribute import profile
from tfsparse.distribute.costs import chain_layers
from tfsparse.distribute.costs import splittable_layers


def sparse_mlp():
    return keras.Sequential([
        keras.Input((20,)),
        tfsparse.SparseDense(30, density=0.2, seed=0, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(5, kernel_regularizer="l2"),
    ])


def test_model_costs_hand_computed():
    model = sparse_mlp()
    nnz = model.layers[0].nnz
    assert nnz == 30 * 4  # 0.2 * 20 inputs per unit
    assert model_costs(model, 8) == [
        (nnz * 8.0, 0.0, nnz * 8.0),  # the network input needs no gradient
        (30 * 8.0, 30 * 8.0, 0.0),  # elementwise, no weights
        (30 * 5 * 8.0, 30 * 5 * 8.0, 30 * 5 * 8.0),
    ]


def test_profile_measures_each_layer():
    model = sparse_mlp()
    costs = profile(model, np.ones((16, 20), "float32"), repeats=3, warmup=1)
    assert len(costs) == 3
    assert all(len(c) == 3 and min(c) >= 0 for c in costs)
    assert costs[0][0] > 0 and costs[2][0] > 0
    assert costs[0][1] == 0.0  # not measured: the pipeline never computes it
    assert costs[1][2] == 0.0  # dropout has no weights


def test_functional_chain_and_rejections():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3)(inputs)
    outputs = keras.layers.Dense(2)(hidden)
    chain = keras.Model(inputs, outputs)
    assert [type(layer).__name__ for layer in chain_layers(chain)] == ["Dense", "Dense"]
    residual = keras.Model(inputs, keras.layers.Add()([keras.layers.Dense(4)(inputs), inputs]))
    with pytest.raises(ValueError, match='"model", expected a chain of single-input layers'):
        chain_layers(residual)
    with pytest.raises(ValueError, match='"model", expected a tf_keras Model'):
        chain_layers("not a model")


def test_splittable_layers():
    model = sparse_mlp()
    # Row-wise layers split; the regularised Dense must not (its penalty
    # would be counted on both stages).
    assert splittable_layers(chain_layers(model)) == [True, True, False]
    batch_norm = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    assert splittable_layers(chain_layers(batch_norm)) == [False]
