"""Each Horovod process runs one pipeline stage; compared with one process.

Run by tests/multiprocess/test_pipeline_two_processes.py as
``horovodrun -np 2 -H localhost:2 --gloo python pipeline_two_processes.py OUT``.
Every rank also trains the same model without a pipeline and with the same
schedule on two logical CPU devices in its own process, and writes
``OUT/rank{r}.json``.
"""

import json
import os
import sys

import numpy as np
from pipeline_process import PipelineStrategy
from pipeline_process import compiled
from pipeline_process import hvd
from pipeline_process import keras
from pipeline_process import tf
from pipeline_process import tfsparse

RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 12)).astype("float32")
Y = RNG.integers(0, 3, 48)


def mlp():
    # The 12x40 first layer dominates: LayerPipe's stage 0 owns no layer and
    # computes rows of layer 0, so weights are refreshed across processes.
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(40, activation="relu"),
        tfsparse.SparseDense(16, density=0.25, seed=3, activation="tanh"),
        keras.layers.Dense(3),
    ])


class SquaresPenalty(keras.layers.Layer):
    """Identity that adds 0.05 x the mean over rows of the squared activations."""

    def call(self, inputs):
        self.add_loss(0.05 * tf.reduce_mean(tf.reduce_sum(tf.square(inputs), axis=1)))
        return inputs


def regularized_mlp():
    # Stage 0 (layers 0 and 1) has every kind of penalty: a weight
    # regularizer, an activity regularizer and an add_loss; stage 1 a bias
    # regularizer. Each penalty is O(0.1) next to a loss of O(1).
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(40, activation="relu",
                           kernel_regularizer=keras.regularizers.L2(0.01),
                           activity_regularizer=keras.regularizers.L1(0.01)),
        SquaresPenalty(),
        tfsparse.SparseDense(16, density=0.25, seed=3, activation="tanh"),
        keras.layers.Dense(3, bias_initializer="ones",
                           bias_regularizer=keras.regularizers.L2(0.1)),
    ])


def train(strategy, optimizer, window, network=mlp, batch_size=12):
    model = compiled(strategy, network, optimizer, window)
    history = model.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    evaluated = model.evaluate(X, Y, batch_size=batch_size, verbose=0)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "loss": history.history["loss"],
        "evaluate": evaluated,
        "plan": (model.pipeline.plan(3).stages if strategy is not None else None),
        "penalty": penalty(model),
    }


def penalty(model):
    """Each layer's regularization losses on the first 12 rows (eagerly)."""
    model(X[:12], training=False)
    return [float(tf.add_n(layer.losses)) if layer.losses else 0.0 for layer in model.layers]


def main(out):
    hvd.init()
    sgd = lambda: keras.optimizers.SGD(0.2)  # noqa: E731
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    results = {"rank": hvd.rank(), "size": hvd.size()}
    for name, schedule, optimizer, window in (
            ("gpipe", "gpipe", sgd, 1),
            ("layerpipe", "layerpipe", adam, 4),
            ("pipedream", "pipedream", sgd, 4)):
        results[name] = {
            "processes": train(PipelineStrategy(devices="horovod", num_microbatches=4,
                                                schedule=schedule), optimizer, window),
            "devices": train(PipelineStrategy(devices=["/cpu:0", "/cpu:1"], num_microbatches=4,
                                              schedule=schedule), optimizer, window),
            "plain": train(None, optimizer, 1),
        }
    # Regularization losses of stage 0 reach the loss that stage 1 reports,
    # in fit and evaluate. 1F1B is synchronous, so it equals training
    # without a pipeline; windows of 2 batches; fit and evaluate in batches
    # of 18, 18 and 12 rows: micro-batches of 5, 5, 4, 4 rows weigh unequally.
    stages = [[0, 1], [2, 3]]
    results["regularized"] = {
        "processes": train(PipelineStrategy(devices="horovod", num_microbatches=4,
                                            schedule="1f1b", stages=stages),
                           sgd, 2, regularized_mlp, 18),
        "devices": train(PipelineStrategy(devices=["/cpu:0", "/cpu:1"], num_microbatches=4,
                                          schedule="1f1b", stages=stages),
                         sgd, 2, regularized_mlp, 18),
        "plain": train(None, sgd, 1, regularized_mlp, 18),
    }
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as handle:
        json.dump(results, handle, default=list)


if __name__ == "__main__":
    main(sys.argv[1])
