"""Run by tests/multiprocess/test_horovod_compression.py under horovodrun -np 2.

Each rank writes ``rank<r>.json`` and ``rank<r>.npz`` into the folder given as
the first argument; the test compares what the ranks wrote.
"""

import json
import os
import sys

import tfsparse  # noqa: F401  (selects Keras 2 before TensorFlow resolves tf.keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from callbacks.compression_monitor import CompressionMonitor  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.compression import NoCompression  # noqa: E402
from tfsparse.compression import SIDCo  # noqa: E402
from tfsparse.compression import TopK  # noqa: E402
from tfsparse.horovod import CompressedExchange  # noqa: E402
from tfsparse.horovod import DistributedOptimizer  # noqa: E402
from tfsparse.horovod import MetricAverageCallback  # noqa: E402


def rank_data(rank, n=512):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(n, 20)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] + 0.3 * x[:, 2] > 0).astype(np.int32)
    return x, y


def model_with(optimizer, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.layers.Dense(64, activation="relu", input_shape=(20,)),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def flat_weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.weights])


def fit(model, epochs, extra_callbacks=()):
    x, y = rank_data(hvd.rank())
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), *extra_callbacks,
                 MetricAverageCallback()]
    return model.fit(x, y, epochs=epochs, batch_size=32, shuffle=False, verbose=0,
                     callbacks=callbacks)


def stats_of(optimizer):
    return {k: float(v.numpy()) for k, v in optimizer.compression_stats.items()}


def known_gradient(rank):
    """A gradient every rank can recompute for every other rank."""
    return np.random.default_rng(7 + rank).laplace(size=1000).astype(np.float32)


def exchange_known_gradients():
    """TopK(0.02) on rank 0, an all-zero gradient (empty payload) on rank 1."""
    variable = tf.Variable(tf.zeros([1000]))
    exchange = CompressedExchange(TopK(0.02))
    exchange.build([variable])
    gradient = known_gradient(0) if hvd.rank() == 0 else np.zeros(1000, np.float32)
    (averaged,) = exchange.exchange([tf.constant(gradient)], [variable])
    reference = np.zeros(1000, np.float32)
    top = np.argsort(-np.abs(known_gradient(0)))[:20]
    reference[top] = known_gradient(0)[top] / 2  # rank 1 sent nothing
    return {
        "max_error": float(np.abs(averaged.numpy() - reference).max()),
        "stats": {k: float(v.numpy()) for k, v in exchange.stats.items()},
    }


def main(out):
    hvd.init()
    rank = hvd.rank()
    result = {"size": hvd.size()}
    arrays = {}

    # 1. SIDCo per tensor; different initial weights per rank, so the
    #    broadcast callback matters.
    sidco = DistributedOptimizer(keras.optimizers.Adam(0.005), compression=SIDCo(0.01))
    model = model_with(sidco, seed=rank)
    monitor = CompressionMonitor()
    history = fit(model, epochs=4, extra_callbacks=[monitor])
    result["sidco_loss"] = [float(v) for v in history.history["loss"]]
    result["sidco_monitor_bytes"] = [float(v) for v in history.history["compression_bytes_sent"]]
    result["sidco_stats"] = stats_of(sidco)
    total = hvd.allreduce(tf.constant(result["sidco_stats"]["total_bytes_sent"], tf.float64), op=hvd.Sum)
    result["sidco_sum_of_bytes_sent"] = float(total.numpy())
    arrays["sidco"] = flat_weights(model)

    # 2. SIDCo fused into one buffer.
    fused = DistributedOptimizer(keras.optimizers.Adam(0.005), compression=SIDCo(0.01),
                                 fused=True)
    model = model_with(fused, seed=10 + rank)
    history = fit(model, epochs=3)
    result["fused_loss"] = [float(v) for v in history.history["loss"]]
    result["fused_stats"] = stats_of(fused)
    arrays["fused"] = flat_weights(model)

    # 3. NoCompression against Horovod's own DistributedOptimizer.
    for name, optimizer in [
        ("horovod", hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))),
        ("none", DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                      compression=NoCompression())),
    ]:
        model = model_with(optimizer, seed=20)
        fit(model, epochs=2)
        arrays[name] = flat_weights(model)

    # 4. Payload sizes of a known exchange, one rank sending nothing.
    result["known"] = exchange_known_gradients()

    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
