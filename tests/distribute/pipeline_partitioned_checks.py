"""PipelineStrategy with a stage on a group of devices (run in a subprocess).

Started by test_pipeline_partitioned.py: logical devices must be configured
before TensorFlow initialises its devices. Four logical CPU devices.
Usage: python pipeline_partitioned_checks.py OUT.json
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 4)

import tfsparse  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.distribute import PipelineStrategy  # noqa: E402
from tfsparse.partition import partition_rows  # noqa: E402
from tfsparse.partition.shards import assemble  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 12)).astype("float32")
Y = RNG.integers(0, 3, 32)
# Stage 0 on a group of 2 (a run of three SparseDense layers at the network
# input, and one after a Dense layer), or stage 1 on a group of 3 (runs of
# two and one layers whose input comes from the previous stage).
CONFIGS = {
    "first": ([["/cpu:0", "/cpu:2"], "/cpu:1"], [[0, 1, 2, 3, 4], [5]]),
    "last": (["/cpu:0", ["/cpu:1", "/cpu:2", "/cpu:3"]], [[0], [1, 2, 3, 4, 5]]),
}
# Stage 0 heavier than stage 1 in every case, so that LayerPipe borrows no
# rows with or without the group and both runs execute the same plan.
COSTS = {"first": [(1, 1, 1)] * 6, "last": [(10, 10, 10)] + [(1, 1, 1)] * 5}


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
    ], name="mlp")


def optimizer(name):
    return keras.optimizers.SGD(0.1) if name == "sgd" else keras.optimizers.Adam(0.01)


def compile_(model, name, steps_per_execution=1):
    model.compile(optimizer(name), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)


def pipelined(devices, stages, schedule, name, steps_per_execution=2, **kwargs):
    strategy = PipelineStrategy(devices=devices, num_microbatches=2, schedule=schedule,
                                stages=stages, **kwargs)
    model = mlp()
    compile_(model, name, steps_per_execution)
    return strategy, strategy.attach(model)


def collapsed(devices):
    """The same stages, each on its group's first device."""
    return [d if isinstance(d, str) else d[0] for d in devices]


def fit(model, epochs=2):
    return model.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0).history


def summary(model, history):
    return {"weights": [w.tolist() for w in model.get_weights()], "history": history,
            "iterations": int(model.optimizer.iterations.numpy())}


# (config, schedule, optimizer, steps_per_execution): windows of 2 steps
# where the schedule overlaps mini-batches (stale weights really used).
EQUIVALENCE = [
    ("first", "gpipe", "sgd", 1), ("first", "layerpipe", "adam", 2),
    ("first", "async", "sgd", 2), ("last", "gpipe", "adam", 1), ("last", "1f1b", "sgd", 1),
    ("last", "pipedream", "sgd", 2), ("last", "layerpipe", "sgd", 2),
]


def equivalence(results):
    """Partitioned stage == the same pipeline without groups (and plain Keras)."""
    for config, schedule, name, steps in EQUIVALENCE:
        devices, stages = CONFIGS[config]
        runs = {}
        for label, used in (("grouped", devices), ("reference", collapsed(devices))):
            _, model = pipelined(used, stages, schedule, name, steps, costs=COSTS[config])
            runs[label] = summary(model, fit(model))
            runs[label]["stage_iterations"] = [
                int(o.iterations.numpy()) for o in model.pipeline.stage_optimizers]
            runs[label]["borrowed"] = list(model.pipeline.plan(4).borrowed)
        results[f"{config}_{schedule}_{name}"] = runs
    for name in ("sgd", "adam"):
        plain = mlp()
        compile_(plain, name)
        results[f"plain_{name}"] = summary(plain, fit(plain))
    # LayerPipe with rows borrowed next to a group (stage 0 lighter), one-step
    # windows: plain training on the whole batch.
    devices, stages = CONFIGS["first"]
    _, model = pipelined(devices, stages, "layerpipe", "sgd", steps_per_execution=1,
                         costs=[(1, 1, 1)] * 5 + [(40, 40, 40)])
    results["first_layerpipe_borrowing"] = summary(model, fit(model))
    results["first_layerpipe_borrowing"]["borrowed"] = list(model.pipeline.plan(4).borrowed)


def _cross_device_words(graph, scope=None):
    """Words per row moved between devices: every tensor consumed on another
    device than its producer's, once per receiving device (as TensorFlow
    sends it), counted when the consumer's name is under ``scope``."""
    seen = {}
    for op in graph.get_operations():
        if not op.device or (scope is not None and not op.name.startswith(scope + "/")):
            continue
        for tensor in op.inputs:
            if tensor.dtype == tf.resource or not tensor.op.device:
                continue
            if tf.DeviceSpec.from_string(op.device) != tf.DeviceSpec.from_string(
                    tensor.op.device):
                seen[(tensor.name, tf.DeviceSpec.from_string(op.device).to_string())] = (
                    int(np.prod(tensor.shape[1:])))
    return sum(seen.values())


def volume(results):
    """Words moved per layer in a partitioned run, read off the traced graph."""
    devices, stages = CONFIGS["last"]
    _, model = pipelined(devices, stages, "gpipe", "sgd", 1)
    fit(model, epochs=1)
    out = {}
    for run in next(iter(model.pipeline._runs.values())):
        part, primary = run.partition, run.devices[0]
        x = tf.constant(RNG.normal(size=(4, run.layers[0].input_dim)).astype("float32"))
        upstream = tf.constant(RNG.normal(size=(4, run.layers[-1].units)).astype("float32"))

        @tf.function(autograph=False)
        def forward(x):
            with tf.device(primary):
                return run.record(tf.identity(x)).outputs

        @tf.function(autograph=False)
        def both(x, upstream):
            with tf.device(primary):
                record = run.record(tf.identity(x))
                record.upstream = tf.identity(upstream)
                return record.outputs, record.input_gradient(), record.weight_gradient()

        graph = forward.get_concrete_function(x).graph
        names = [layer.name for layer in run.layers]
        # Independent reference of the entry: the inputs device p's neurons
        # of the first layer read (devices other than the first).
        pattern = run.layers[0].pattern
        entry = sum(np.unique(pattern.rows[part.owners[1][pattern.cols] == p]).size
                    for p in range(1, part.k))
        y, dx, grads = both(x, upstream)
        with tf.GradientTape() as tape:
            tape.watch(x)
            hidden = x
            for layer in run.layers:
                hidden = layer(hidden)
        variables = [v for layer in run.layers for v in layer.trainable_variables]
        want = tape.gradient(hidden, [x] + variables, output_gradients=upstream)
        # Shard gradients back in the layers' order: the same scatter as store().
        got = []
        position = 0
        for l, layer in enumerate(run.layers):
            parts = len(run.devices) * (2 if layer.use_bias else 1)
            shard = grads[position:position + parts]
            position += parts
            plans = run.plans[l]
            got.append(assemble(shard[0::2] if layer.use_bias else shard,
                                [plan.positions for plan in plans], layer.nnz))
            if layer.use_bias:
                got.append(assemble(shard[1::2], [plan.owned_outputs for plan in plans],
                                    layer.units))
        out[run.name] = {
            "k": part.k,
            "measured_layers": [_cross_device_words(graph, f"partitioned_{n}")
                                for n in names[1:]],
            "predicted_layers": [int(v) for v in part.send.sum(axis=1)[1:]],
            "measured_entry": _cross_device_words(graph, f"partitioned_{names[0]}"),
            "predicted_entry": int(entry),
            "measured_exit": _cross_device_words(graph, "partitioned_output"),
            "predicted_exit": int(np.sum(part.owners[-1] != 0)),
            "words_per_sample": [run.words_per_sample()[0], list(run.words_per_sample()[1]),
                                 run.words_per_sample()[2]],
            "forward_total": _cross_device_words(graph),
            "training_total": _cross_device_words(
                both.get_concrete_function(x, upstream).graph),
            "output_error": float(np.max(np.abs(y.numpy() - hidden.numpy()))),
            "input_gradient_error": float(np.max(np.abs(dx.numpy() - want[0].numpy()))),
            "weight_gradient_error": max(float(np.max(np.abs(a.numpy() - b.numpy())))
                                         for a, b in zip(got, want[1:])),
            "shard_devices": sorted({v.device.split("/")[-1]
                                     for v in run.trainable_variables}),
        }
    results["volume"] = out
    window = model.pipeline._windows[8]  # batches of 8 rows
    batch = [(tf.constant(X[:8]), tf.constant(Y[:8]), None)]
    graph = window.get_concrete_function(batch).graph
    results["devices_used"] = sorted({op.device.split("/")[-1] for op in graph.get_operations()
                                      if op.device})
    # Weight gradients (made under the partitioned_*_weights scopes) are
    # summed and applied on the device that made them.
    edges = [(op.device, tensor.op.device) for op in graph.get_operations()
             for tensor in op.inputs
             if "partitioned_" in tensor.op.name and "_weights/" in tensor.op.name
             and op.device and tensor.op.device]
    results["weight_gradient_edges"] = len(edges)
    results["weight_gradient_edges_leaving"] = sum(
        tf.DeviceSpec.from_string(a) != tf.DeviceSpec.from_string(b) for a, b in edges)


def save_and_reload(results):
    devices, stages = CONFIGS["last"]
    _, model = pipelined(devices, stages, "layerpipe", "sgd", 1, costs=COSTS["last"])
    fit(model, epochs=1)
    path = os.path.join(tempfile.mkdtemp(), "partitioned.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    checkpoint = os.path.join(tempfile.mkdtemp(), "ckpt")
    model.save_weights(checkpoint)
    restored = mlp()
    restored.load_weights(checkpoint)
    plain = mlp()
    compile_(plain, "sgd")
    plain.set_weights(model.get_weights())
    results["save"] = {
        "weights": [w.tolist() for w in model.get_weights()],
        "loaded_weights": [w.tolist() for w in loaded.get_weights()],
        "restored_weights": [w.tolist() for w in restored.get_weights()],
        "variables": sorted(v.name for v in model.variables),
        "plain_variables": sorted(v.name for v in plain.variables),
        "predict": model.predict(X[:10], batch_size=10, verbose=0).tolist(),
        "loaded_predict": loaded.predict(X[:10], batch_size=10, verbose=0).tolist(),
        "plain_predict": plain.predict(X[:10], batch_size=10, verbose=0).tolist(),
        "evaluate": model.evaluate(X, Y, batch_size=8, verbose=0),
        "plain_evaluate": plain.evaluate(X, Y, batch_size=8, verbose=0),
    }
    # Weights set between fits are what the next window trains from.
    start = mlp().get_weights()
    model.set_weights(start)
    _, reference = pipelined(collapsed(devices), stages, "layerpipe", "sgd", 1,
                             costs=COSTS["last"])
    reference.set_weights(start)
    results["set_weights"] = {"grouped": summary(model, fit(model, 1)),
                              "reference": summary(reference, fit(reference, 1))}


def changed_pattern(results):
    """Weights of another pattern loaded after the group's shards were cut."""
    devices, stages = CONFIGS["last"]
    other = mlp()
    for layer in other.layers:  # the same shapes and counts, other positions
        if isinstance(layer, tfsparse.SparseDense):
            fan_in = layer.nnz / layer.units / layer.input_dim
            layer.set_pattern(tfsparse.ops.SparsityPattern.random(
                (layer.input_dim, layer.units), fan_in, seed=7), layer.values)
    checkpoint = os.path.join(tempfile.mkdtemp(), "other")
    other.save_weights(checkpoint)
    plain = mlp()
    compile_(plain, "sgd")
    plain.load_weights(checkpoint)
    out = {"plain_predict": plain.predict(X[:10], batch_size=10, verbose=0).tolist()}
    strategy, model = pipelined(devices, stages, "gpipe", "sgd", 1)
    fit(model, epochs=1)
    model.load_weights(checkpoint)
    for kind, run in (("predict", lambda: model.predict(X[:10], batch_size=10, verbose=0)),
                      ("fit", lambda: fit(model, epochs=1))):
        try:
            run()
            out[f"{kind}_error"] = None
        except tf.errors.InvalidArgumentError as error:
            out[f"{kind}_error"] = error.message
    strategy.attach(model)  # partitions the loaded pattern at its next run
    out["reattached_predict"] = model.predict(X[:10], batch_size=10, verbose=0).tolist()
    _, fresh = pipelined(devices, stages, "gpipe", "sgd", 1)
    fresh.load_weights(checkpoint)  # before the pipeline first runs it
    out["loaded_first_predict"] = fresh.predict(X[:10], batch_size=10, verbose=0).tolist()
    results["changed_pattern"] = out


def _perturbed(weights, seed):
    rng = np.random.default_rng(seed)
    return [w + (0.1 * rng.normal(size=w.shape)).astype(w.dtype) if w.dtype.kind == "f"
            else w for w in weights]


def inference(results):
    """evaluate and predict of a grouped stage: partitioned, plain Keras's results."""
    x, y = X[:31], Y[:31]  # batches of 8, 8, 8 and 7 (micro-batches of 4 and 3)
    out = {}
    for config, stages, train in (("last", CONFIGS["last"][1], True), ("first", None, False)):
        devices = CONFIGS[config][0]
        _, model = pipelined(devices, stages, "gpipe", "sgd", 2)
        if train:
            # Weights written after training, while the shards still hold
            # the trained ones: inference must read the layers' variables.
            fit(model, 1)
            model.set_weights(_perturbed(model.get_weights(), 5))
        plain = mlp()
        compile_(plain, "sgd")
        plain.set_weights(model.get_weights())
        out[config] = {
            "predict": model.predict(x, batch_size=8, verbose=0).tolist(),
            "plain_predict": plain.predict(x, batch_size=8, verbose=0).tolist(),
            "evaluate": model.evaluate(x, y, batch_size=8, verbose=0),
            "plain_evaluate": plain.evaluate(x, y, batch_size=8, verbose=0),
            "runs": [[run.name, run.devices] for found in model.pipeline._runs.values()
                     for run in found],
        }
    # The inference graphs of the "last" model (stage 1 on 3 devices): the
    # partitioned layers' ops on every device of the group, and the words
    # each run moves per sample those of the partition, as in training.
    devices, stages = CONFIGS["last"]
    _, model = pipelined(devices, stages, "gpipe", "sgd", 1)
    pipeline = model.pipeline
    batch = (tf.constant(X[:8]), tf.constant(Y[:8]), None)
    predict = tf.function(pipeline.predict_window, autograph=False)
    graph = predict.get_concrete_function([(batch[0], None, None)]).graph
    evaluate = tf.function(pipeline.evaluate_window, autograph=False)
    evaluate_graph = evaluate.get_concrete_function([batch]).graph
    graphs = {}
    for run in pipeline._stage_runs(pipeline.forward_stages()):
        part = run.partition
        names = [layer.name for layer in run.layers]
        pattern = run.layers[0].pattern
        entry = sum(np.unique(pattern.rows[part.owners[1][pattern.cols] == p]).size
                    for p in range(1, part.k))
        graphs[run.name] = {
            # The first micro-batch's scopes (the second's are suffixed).
            "measured_layers": [_cross_device_words(graph, f"partitioned_{n}")
                                for n in names[1:]],
            "predicted_layers": [int(v) for v in part.send.sum(axis=1)[1:]],
            "measured_entry": _cross_device_words(graph, f"partitioned_{names[0]}"),
            "predicted_entry": int(entry),
            "devices": {kind: sorted({
                op.device.split("/")[-1] for op in found.get_operations()
                if op.device and any(op.name.startswith(f"partitioned_{n}/") for n in names)})
                for kind, found in (("predict", graph), ("evaluate", evaluate_graph))},
        }
    out["graphs"] = graphs
    results["inference"] = out


def softmax_mlp():
    keras.utils.set_random_seed(1)
    layers = [(24, "relu"), (20, "softmax"), (16, "tanh"), (3, "log_softmax")]
    return keras.Sequential([keras.Input((12,))] + [
        tfsparse.SparseDense(units, density=0.5 if units < 4 else 0.3, seed=index + 1,
                             activation=activation, name=f"sparse_{index}")
        for index, (units, activation) in enumerate(layers)], name="softmax_mlp")


def softmax_runs(results):
    """Softmax in a grouped stage: it ends its run and is applied to the
    run's assembled output (stage 1 on 3 devices runs [1] and [2, 3], the
    latter ending with log_softmax: a model whose output is Keras's softmax
    cannot be pipelined, see the report)."""
    devices, stages = ["/cpu:0", ["/cpu:1", "/cpu:2", "/cpu:3"]], [[0], [1, 2, 3]]
    runs = {}
    for label, used in (("grouped", devices), ("reference", collapsed(devices)),
                        ("plain", None)):
        model = softmax_mlp()
        model.compile(keras.optimizers.SGD(0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if used is not None:
            PipelineStrategy(devices=used, num_microbatches=2, schedule="gpipe",
                             stages=stages).attach(model)
        runs[label] = summary(model, fit(model))
        runs[label]["predict"] = model.predict(X[:10], batch_size=8, verbose=0).tolist()
        if label == "grouped":
            runs["runs"] = [[layer.name for layer in run.layers]
                            for found in model.pipeline._runs.values() for run in found]
    results["softmax"] = runs


def simulated(results):
    devices, stages = CONFIGS["first"]
    strategy, model = pipelined(devices, None, "gpipe", "sgd")
    result = strategy.simulate(model, batch_size=8, steps=2)
    costs = tfsparse.distribute.model_costs(model, 4)
    results["simulate"] = {"stages": [list(g) for g in result.plan.stages],
                           "stage_costs": [list(c) for c in result.stage_costs],
                           "costs": [list(c) for c in costs],
                           "cycles": result.cycles}


def bad_inputs(results):
    errors = {}

    def catch(key, fn):
        try:
            fn()
        except ValueError as error:
            errors[key] = str(error)

    devices, stages = CONFIGS["first"]
    catch("missing", lambda: PipelineStrategy(devices=[["/cpu:0", "/cpu:9"], "/cpu:1"]))
    catch("empty", lambda: PipelineStrategy(devices=[[], "/cpu:1"]))
    catch("method", lambda: PipelineStrategy(devices=devices, partition="metis"))
    model = mlp()
    kernels = [layer.to_scipy() if hasattr(layer, "to_scipy") else None for layer in model.layers]
    two = partition_rows(kernels[:3], 2)
    three = partition_rows(kernels[:3], 3)
    catch("k", lambda: PipelineStrategy(devices=devices, partition=three))
    catch("single", lambda: PipelineStrategy(devices=devices, partition=[None, two]))

    def fit_with(devices, stages, **kwargs):
        _, model = pipelined(devices, stages, "gpipe", "sgd", 1, **kwargs)
        fit(model, 1)

    catch("no_sparse", lambda: fit_with(["/cpu:0", ["/cpu:1", "/cpu:2"]], [[0, 1, 2, 3, 4],
                                                                           [5]]))
    catch("count", lambda: fit_with(devices, stages, partition=two))
    catch("sizes", lambda: fit_with(devices, stages, partition=[[two, two], None]))
    results["errors"] = errors
    # An explicit Partition per run is used as given.
    last = partition_rows(kernels[4:5], 2, method="block")
    _, model = pipelined(devices, stages, "gpipe", "sgd", 1, partition=[[two, last], None])
    fit(model, 1)
    used = model.pipeline.partitions()[0]
    results["explicit"] = [[o.tolist() for o in p.owners] for p in used] == [
        [o.tolist() for o in p.owners] for p in (two, last)]


def main(path):
    results = {}
    for check in (equivalence, volume, save_and_reload, changed_pattern, inference,
                  softmax_runs, simulated, bad_inputs):
        check(results)
    with open(path, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
