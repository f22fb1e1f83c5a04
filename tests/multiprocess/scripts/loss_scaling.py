"""Run by tests/multiprocess/test_loss_scaling.py under horovodrun -np 2.

mixed_float16 with DistributedOptimizer(LossScaleOptimizer(Adam)): rank 1's
targets are about 100 (its float16 gradients overflow at the first steps),
rank 0's about 1. Each rank writes ``rank<r>.json`` into the folder given.
"""

import json
import os
import sys

import tfsparse  # noqa: F401  (selects Keras 2 before TensorFlow resolves tf.keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402

from tfsparse import keras  # noqa: E402
from tfsparse.compression import NoCompression  # noqa: E402
from tfsparse.compression import TopK  # noqa: E402
from tfsparse.horovod import DistributedOptimizer  # noqa: E402


def train(optimizer, rank):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
    finally:
        keras.mixed_precision.set_global_policy(None)
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(rank)
    x = 10 * rng.normal(size=(64, 8)).astype(np.float32)
    y = ((100.0 if rank == 1 else 1.0) * (1 + 0.1 * x[:, :1])).astype(np.float32)
    scales = []

    class Scales(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            scales.append(float(model.optimizer.loss_scale.numpy()))

    model.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Scales()])
    return {"weights": [w.numpy().tolist() for w in model.weights], "scales": scales,
            "iterations": int(model.optimizer.iterations.numpy())}


def main(out):
    hvd.init()
    rank = hvd.rank()
    lso = keras.mixed_precision.LossScaleOptimizer
    results = {"size": hvd.size(),
               "plain": train(lso(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2))), rank)}
    for name, compression, nonfinite in (("none", NoCompression(), "raise"),
                                         ("topk", TopK(0.25), "raise"),
                                         ("topk_skip", TopK(0.25), "skip")):
        results[name] = train(DistributedOptimizer(lso(keras.optimizers.Adam(1e-2)),
                                                   compression, nonfinite=nonfinite), rank)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
