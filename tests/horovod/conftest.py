"""Models shared by the tests of tfsparse.horovod."""

import pytest

from tfsparse import keras


@pytest.fixture
def embedding_model():
    """Builds Embedding(vocabulary, 4) -> Flatten -> Dense(1), compiled with MSE (seeded)."""

    def build(optimizer, vocabulary):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.layers.Embedding(vocabulary, 4, input_length=3),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer, "mse")
        return model

    return build
