"""evaluate and predict with one pipeline stage per Horovod process.

Run by tests/multiprocess/test_pipeline_inference_processes.py as
``horovodrun -np 2 -H localhost:2 --gloo python pipeline_inference_processes.py OUT``.
Every rank evaluates and predicts with ``PipelineStrategy(devices="horovod")``,
then with the same weights in one process without a pipeline (the
reference) and on two logical CPU devices, and writes ``OUT/rank{r}.json``.
Every layer counts the calls and rows it executes, so the test sees which
process ran which stage.
"""

import json
import os
import sys

import numpy as np
from pipeline_process import PipelineStrategy
from pipeline_process import hvd
from pipeline_process import keras
from pipeline_process import tf
from pipeline_process import tfsparse

RNG = np.random.default_rng(0)
X = RNG.normal(size=(54, 12)).astype("float32")
Y = RNG.integers(0, 3, 54)
WEIGHT = RNG.uniform(0.5, 2.0, 54).astype("float32")
MICROBATCHES = 4
# evaluate: 54 rows in batches of 12, the last of 6 (not a multiple of 4);
# predict: 50 rows in batches of 16, the last of 2 (fewer rows than 4).
EVALUATE = dict(rows=54, batch_size=12)
PREDICT = dict(rows=50, batch_size=16)


class Counting:
    """Counts the calls and rows this layer executes (int64: never broadcast)."""

    def build(self, input_shape):
        super().build(input_shape)
        self.calls = self.add_weight(name="calls", shape=(), dtype="int64",
                                     initializer="zeros", trainable=False)
        self.rows = self.add_weight(name="rows", shape=(), dtype="int64",
                                    initializer="zeros", trainable=False)

    def call(self, inputs):
        self.calls.assign_add(1)
        self.rows.assign_add(tf.shape(inputs, out_type=tf.int64)[0])
        return super().call(inputs)


class CountingDense(Counting, keras.layers.Dense):
    pass


class CountingSparseDense(Counting, tfsparse.SparseDense):
    pass


def mlp():
    # Cost model: 480, 160 and 48 multiply-adds per row, so the forward
    # stages are [[0], [1, 2]].
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((12,)),
        CountingDense(40, activation="relu"),
        CountingSparseDense(16, density=0.25, seed=3, activation="tanh"),
        CountingDense(3),
    ])


def build(strategy, optimizer, window):
    def make():
        model = mlp()
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy",
                               keras.metrics.SparseCategoricalCrossentropy(from_logits=True)],
                      weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(
                          name="weighted_accuracy")],
                      steps_per_execution=window)
        return model

    model = make()
    return model if strategy is None else strategy.attach(model)


def counts(model):
    return {"calls": [int(layer.calls.numpy()) for layer in model.layers],
            "rows": [int(layer.rows.numpy()) for layer in model.layers]}


def reset_counts(model):
    for layer in model.layers:
        layer.calls.assign(0)
        layer.rows.assign(0)


def evaluate_and_predict(model, weighted):
    weight = WEIGHT[:EVALUATE["rows"]] if weighted else None
    reset_counts(model)
    evaluated = model.evaluate(X[:EVALUATE["rows"]], Y[:EVALUATE["rows"]],
                               sample_weight=weight, batch_size=EVALUATE["batch_size"],
                               verbose=0)
    evaluate_counts = counts(model)
    reset_counts(model)
    predicted = model.predict(X[:PREDICT["rows"]], batch_size=PREDICT["batch_size"], verbose=0)
    return {"evaluate": evaluated, "predict": predicted.tolist(),
            "evaluate_counts": evaluate_counts, "predict_counts": counts(model),
            "metrics_state": [float(m.result().numpy()) for m in model.metrics]}


def case(schedule, optimizer, window, train, weighted):
    strategy = PipelineStrategy(devices="horovod", num_microbatches=MICROBATCHES,
                                schedule=schedule)
    model = build(strategy, optimizer(), window)
    result = {}
    if train:  # validation after the epoch: a pipelined evaluate of 6 rows
        history = model.fit(X[:48], Y[:48], batch_size=12, epochs=1, shuffle=False,
                            validation_data=(X[48:], Y[48:]), verbose=0)
        result["val_loss"] = history.history["val_loss"]
    result["processes"] = evaluate_and_predict(model, weighted)
    result["forward_stages"] = [list(g) for g in model.pipeline.forward_stages()]
    # The same weights in one process: without a pipeline, and pipelined over
    # two local devices.
    plain = build(None, optimizer(), window)
    plain.set_weights(model.get_weights())
    if train:
        result["plain_val_loss"] = plain.evaluate(X[48:], Y[48:], verbose=0)[0]
    result["plain"] = evaluate_and_predict(plain, weighted)
    local = build(PipelineStrategy(devices=["/cpu:0", "/cpu:1"], num_microbatches=MICROBATCHES,
                                   schedule=schedule), optimizer(), window)
    local.set_weights(model.get_weights())
    result["devices"] = evaluate_and_predict(local, weighted)
    return result


def main(out):
    hvd.init()
    results = {"rank": hvd.rank(), "size": hvd.size()}
    # Evaluated before any training (the loss and metric containers are built
    # in every process), one batch per graph.
    results["fresh"] = case("gpipe", lambda: keras.optimizers.SGD(0.1), 1, False, False)
    # After training with LayerPipe (whose training plan borrows rows; the
    # forward pass uses whole layers), windows of 3 batches, sample weights.
    results["trained"] = case("layerpipe", lambda: keras.optimizers.Adam(0.01), 3, True, True)
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
