"""Run by tests/multiprocess/test_loss_scaling.py under horovodrun -np 2.

mixed_float16 with DistributedOptimizer(LossScaleOptimizer(Adam)), and the
other nesting, LossScaleOptimizer(DistributedOptimizer(Adam)), written out or
made by Keras's compile: rank 1's targets are about 100 (its float16
gradients overflow at the first steps), rank 0's about 1. Each rank writes
``rank<r>.json`` into the folder given.
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
from callbacks import CompressionMonitor  # noqa: E402
from callbacks import DynamicSparsity  # noqa: E402
from tfsparse import SparseDense  # noqa: E402


def train(optimizer, rank, monitor=False, rigl=False):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(5)
        hidden = (SparseDense(32, density=0.5, seed=1, activation="relu", name="hidden")
                  if rigl else keras.layers.Dense(32, activation="relu"))
        model = keras.Sequential([keras.Input((8,)), hidden,
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

    extra = [CompressionMonitor(update_freq="batch")] if monitor else []
    if rigl:  # updates every 2 steps: the first ones fall on rank 1's overflowing steps
        extra.append(DynamicSparsity("rigl", update_every=2, drop_fraction=0.3, seed=3))
    model.fit(x, y, epochs=3, batch_size=16, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Scales(), *extra])
    result = {"weights": [w.numpy().tolist() for w in model.weights], "scales": scales,
              "iterations": int(model.optimizer.iterations.numpy()),
              "wrapped_by_compile": model.optimizer is not optimizer}
    if rigl:
        result["skipped_steps"] = extra[-1].skipped_steps
        result["updates"] = [update["step"] for update in extra[-1].updates]
        result["pattern"] = model.get_layer("hidden").pattern_rows.numpy().tolist()
    if monitor:
        stats = model.optimizer.inner_optimizer.compression_stats
        result["exchanges"] = float(stats["steps"].numpy())
        result["monitor_records"] = len(extra[0].steps)
    return result


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
    # The other nesting: the loss scale optimizer outside, as Keras's compile
    # makes it under mixed_float16 ("compile_wrapped": no explicit one).
    results["outside_none"] = train(lso(DistributedOptimizer(keras.optimizers.Adam(1e-2))), rank)
    results["outside_topk"] = train(
        lso(DistributedOptimizer(keras.optimizers.Adam(1e-2), TopK(0.25))), rank)
    results["outside_legacy"] = train(
        lso(DistributedOptimizer(keras.optimizers.legacy.Adam(1e-2), TopK(0.25))), rank)
    # A legacy optimizer summing two passes per exchange inside the loss
    # scale optimizer (its apply conds on an op: a tensor here failed to
    # trace). Horovod's own optimizer has no counterpart here: with two
    # passes its ranks' loss scales drift apart (each judges its own pass).
    results["outside_legacy_passes"] = train(
        lso(DistributedOptimizer(keras.optimizers.legacy.Adam(1e-2), TopK(0.25),
                                 backward_passes_per_step=2)), rank)
    results["rigl"] = train(DistributedOptimizer(lso(keras.optimizers.Adam(1e-2)), TopK(0.25)),
                            rank, rigl=True)
    results["compile_wrapped"] = train(
        DistributedOptimizer(keras.optimizers.Adam(1e-2), TopK(0.25)), rank, monitor=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
