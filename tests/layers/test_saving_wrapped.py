"""tfsparse's Keras classes reload where tf_keras looks them up by bare name.

Keras names them ``tfsparse>SparseDense`` etc.; inside ``TimeDistributed``
(or ``Bidirectional``) and for regularizers in ``.h5`` files tf_keras looks
up the bare class name, and loading, cloning and sparsify failed with
"Unknown layer: 'SparseDense'" unless the user passed custom_objects.
"""

import numpy as np
import pytest

from tfsparse import keras
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense
from tfsparse.layers import sparsify
from tfsparse.regularizers import GroupLasso


def _time_distributed(inner, shape):
    inputs = keras.Input(shape)
    return keras.Model(inputs, keras.layers.TimeDistributed(inner, name="wrapped")(inputs))


CASES = {
    "dense": (lambda: SparseDense(4, density=0.5, seed=3), (3, 6)),
    "conv": (lambda: SparseConv2D(2, 3, density=0.5, seed=1), (2, 5, 5, 2)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("file_name", ["model.keras", "model.h5"])
def test_a_wrapped_sparse_layer_reloads_without_custom_objects(tmp_path, case, file_name):
    make, shape = CASES[case]
    model = _time_distributed(make(), shape)
    x = np.random.default_rng(0).standard_normal((2, *shape)).astype("float32")
    expected = model.predict(x, verbose=0)
    model.save(tmp_path / file_name)
    reloaded = keras.models.load_model(tmp_path / file_name)
    np.testing.assert_array_equal(reloaded.predict(x, verbose=0), expected)
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone.predict(x, verbose=0), expected)


def test_sparsify_copies_a_wrapped_sparse_layer():
    model = _time_distributed(SparseDense(4, density=0.5, seed=3), (3, 6))
    x = np.random.default_rng(1).standard_normal((2, 3, 6)).astype("float32")
    np.testing.assert_array_equal(sparsify(model).predict(x, verbose=0),
                                  model.predict(x, verbose=0))


@pytest.mark.parametrize("layer", [
    lambda: keras.layers.Dense(4, kernel_regularizer=GroupLasso(1e-3, groups="columns")),
    lambda: SparseDense(4, density=0.5, seed=2,
                        kernel_regularizer=GroupLasso(1e-3, groups="columns")),
])
def test_a_group_lasso_regularizer_reloads_from_h5(tmp_path, layer):
    model = keras.Sequential([keras.Input((6,)), layer()])
    model.save(tmp_path / "model.h5")
    reloaded = keras.models.load_model(tmp_path / "model.h5")
    regularizer = reloaded.layers[0].kernel_regularizer
    assert isinstance(regularizer, GroupLasso)
    assert regularizer.get_config() == model.layers[0].kernel_regularizer.get_config()
    np.testing.assert_allclose(sum(reloaded.losses).numpy(), sum(model.losses).numpy(),
                               rtol=1e-6)
