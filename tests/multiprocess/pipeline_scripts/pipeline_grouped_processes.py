"""One pipeline stage per Horovod process, each on a group of two local devices.

Run by tests/multiprocess/test_pipeline_grouped_processes.py as
``horovodrun -np 2 -H localhost:2 --gloo python pipeline_grouped_processes.py OUT``.
Every process has two logical CPU devices and runs its stage with
``local_devices=["/cpu:0", "/cpu:1"]``: its SparseDense layers are
row-partitioned over them. Every rank also trains the same model as a
pipeline of two ungrouped local devices and without a pipeline, and writes
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
LOCAL = ["/cpu:0", "/cpu:1"]
# "both": a run of three SparseDense layers in stage 0 and one in stage 1,
# which starts with it (so it receives straight into a partitioned layer);
# "first": stage 1 holds only the classifier, which runs on the first device.
STAGES = {"both": [[0, 1, 2, 3], [4, 5]], "first": [[0, 1, 2, 3, 4], [5]]}
# Stage 0 heavier than stage 1 with and without the groups, so that LayerPipe
# borrows no rows in either and both execute the same plan.
COSTS = [(10, 10, 10)] * 3 + [(1, 1, 1)] * 3


def mlp():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((12,)),
        tfsparse.SparseDense(24, density=0.3, seed=1, activation="relu", name="sparse_0"),
        tfsparse.SparseDense(24, density=0.3, seed=2, activation="relu", name="sparse_1"),
        tfsparse.SparseDense(20, density=0.3, seed=3, activation="tanh", name="sparse_2"),
        keras.layers.Dense(16, activation="relu", name="dense_3"),
        tfsparse.SparseDense(16, density=0.3, seed=4, activation="relu", name="sparse_4"),
        keras.layers.Dense(3, name="dense_5"),
    ])


def partitioned_ops(model, window):
    """Ops under a partitioned layer's scope, per device, in the traced graphs
    of the training window and of ``predict``'s window."""
    train = model.pipeline._windows[len(X[:12])]  # batches of 12 rows
    predict = model.pipeline._inference_windows["predict"]
    return {
        "train": _ops_per_device(train.get_concrete_function(
            [(tf.constant(X[:12]), tf.constant(Y[:12]), None)] * window).graph),
        "predict": _ops_per_device(predict.get_concrete_function(
            [(tf.constant(X[:18]), None, None)]).graph),
    }


def _ops_per_device(graph):
    counts = {}
    for op in graph.get_operations():
        if op.device and op.name.startswith("partitioned_"):
            device = tf.DeviceSpec.from_string(op.device).to_string().split("/")[-1]
            counts[device] = counts.get(device, 0) + 1
    return counts


def train(strategy, optimizer, window):
    model = compiled(strategy, mlp, optimizer, window)
    history = model.fit(X, Y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    # Batches of 18 rows: the last (12 rows) is cut into unequal micro-batches.
    result = {
        "weights": [w.tolist() for w in model.get_weights()],
        "loss": history.history["loss"],
        "evaluate": model.evaluate(X, Y, batch_size=18, verbose=0),
        "predict": model.predict(X, batch_size=18, verbose=0).tolist(),
    }
    if strategy is not None:
        plan = model.pipeline.plan(3)
        result["plan"] = [list(stage) for stage in plan.stages]
        result["borrowed"] = list(plan.borrowed)
        partitions = model.pipeline.partitions()
        result["partitioned_stages"] = sorted(partitions)
        result["partition_k"] = [p.k for parts in partitions.values() for p in parts]
        runs = [run for found in model.pipeline._runs.values() for run in found]
        result["runs"] = sorted({run.name for run in runs})
        result["shard_devices"] = sorted({
            tf.DeviceSpec.from_string(v.device).to_string().split("/")[-1]
            for run in runs for v in run.trainable_variables})
        if not model.run_eagerly and runs:
            result["partitioned_ops"] = partitioned_ops(model, window)
    return result


def main(out):
    hvd.init()
    sgd = lambda: keras.optimizers.SGD(0.2)  # noqa: E731
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    results = {"rank": hvd.rank(), "size": hvd.size()}
    for name, schedule, optimizer, window, stages in (
            ("gpipe", "gpipe", sgd, 1, "both"),
            ("pipedream", "pipedream", adam, 2, "both"),
            ("layerpipe", "layerpipe", sgd, 2, "both"),
            ("1f1b", "1f1b", adam, 2, "both"),
            ("async", "async", sgd, 2, "both"),
            ("first_only", "gpipe", sgd, 2, "first")):
        def strategy(devices, **kwargs):
            return PipelineStrategy(devices=devices, num_microbatches=4, schedule=schedule,
                                    stages=STAGES[stages], costs=COSTS, **kwargs)

        results[name] = {
            "processes": train(strategy("horovod", local_devices=LOCAL), optimizer, window),
            "devices": train(strategy(LOCAL), optimizer, window),
            "plain": train(None, optimizer, 1),
        }
    # Measured costs differ between processes; the stages must not: every
    # process plans with rank 0's costs (here the reverse order in rank 1).
    costs = COSTS if hvd.rank() == 0 else COSTS[::-1]
    strategy = PipelineStrategy(devices="horovod", num_microbatches=4, schedule="gpipe",
                                costs=costs)
    model = mlp()
    model.compile("sgd", "mse")
    strategy.attach(model)
    results["rank_costs"] = {"plan": [list(s) for s in model.pipeline.plan(3).stages],
                             "costs": [list(c) for c in strategy.costs]}
    errors = {}
    for label, kwargs in (("not_horovod", dict(devices=LOCAL, local_devices=LOCAL)),
                          ("missing", dict(devices="horovod", local_devices=["/cpu:7"])),
                          ("string", dict(devices="horovod", local_devices="/cpu:0"))):
        try:
            PipelineStrategy(**kwargs)
            errors[label] = None
        except ValueError as error:
            errors[label] = str(error)
    results["errors"] = errors
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as handle:
        json.dump(results, handle, default=list)


if __name__ == "__main__":
    main(sys.argv[1])
