"""tfmot's prune_low_magnitude prunes the values of a SparseDense model."""

import numpy as np
import pytest

from tfsparse._keras import keras
import tensorflow_model_optimization as tfmot

from tfsparse.layers import SparseDense


def test_prune_low_magnitude_prunes_sparse_dense_values():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((12,)),
        SparseDense(16, density=0.5, seed=1, activation="relu", name="sparse"),
        keras.layers.Dense(3, name="head"),
    ])
    schedule = tfmot.sparsity.keras.ConstantSparsity(0.75, begin_step=0, frequency=1)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(model, pruning_schedule=schedule)
    pruned.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 12)).astype(np.float32)
    y = rng.standard_normal((64, 3)).astype(np.float32)
    pruned.fit(x, y, epochs=2, batch_size=16, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    sparse = stripped.get_layer("sparse")
    assert isinstance(sparse, SparseDense)
    values = sparse.values.numpy()
    # ConstantSparsity(0.75) zeroes the 75% smallest magnitudes of the values vector
    # (tfmot rounds the count of kept values down to whole values).
    assert np.mean(values == 0) == pytest.approx(0.75, abs=1.0 / values.size)
    np.testing.assert_allclose(stripped(x).numpy(), pruned(x).numpy(), atol=1e-6)
