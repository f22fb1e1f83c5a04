"""Runs PipelineStrategy on two logical CPU devices; writes results as JSON.

Started by test_pipeline_strategy.py in a subprocess: logical devices must be
configured before TensorFlow initialises its devices, which the pytest
process has already done. Usage: python pipeline_strategy_checks.py OUT.json
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
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import tfsparse  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.distribute import PipelineStrategy  # noqa: E402
from tfsparse.distribute import schedule as make_schedule  # noqa: E402
from tfsparse.distribute import schedules as S  # noqa: E402

DEVICES = ["/cpu:0", "/cpu:1"]
RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 12)).astype("float32")
Y = RNG.integers(0, 3, 48)


def mlp():
    # Layer 0 is the heaviest (12x40), so LayerPipe borrows rows of it.
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(40, activation="relu"),
        tfsparse.SparseDense(16, density=0.25, seed=3, activation="tanh"),
        keras.layers.Dense(3),
    ])


def compile_(model, optimizer, steps_per_execution=1):
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)


def weights(model):
    return [w.numpy().tolist() for w in model.trainable_weights]


def plain_run(optimizer, epochs=2):
    model = mlp()
    compile_(model, optimizer)
    history = model.fit(X, Y, batch_size=12, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history


def pipelined(schedule, optimizer, steps_per_execution=1, **kwargs):
    strategy = PipelineStrategy(devices=DEVICES, num_microbatches=kwargs.pop("m", 4),
                                schedule=schedule, **kwargs)
    model = mlp()
    compile_(model, optimizer, steps_per_execution)
    return strategy, strategy.attach(model)


def synchronous_equivalence(results):
    """gpipe/1f1b (and layerpipe/pipedream inside one-step windows) == plain."""
    for name in ("sgd", "adam"):
        make = (lambda: keras.optimizers.SGD(0.2)) if name == "sgd" else (
            lambda: keras.optimizers.Adam(0.01))
        reference, history = plain_run(make())
        results[f"plain_{name}"] = {"weights": weights(reference), "history": history}
        for schedule in ("gpipe", "1f1b", "layerpipe", "pipedream"):
            strategy, model = pipelined(schedule, make())
            fit = model.fit(X, Y, batch_size=12, epochs=2, shuffle=False, verbose=0)
            plan = model.pipeline.plan(3)
            results[f"{schedule}_{name}"] = {
                "weights": weights(model), "history": fit.history,
                "stages": [list(g) for g in plan.stages], "borrowed": list(plan.borrowed),
                "stage_iterations": [int(o.iterations.numpy())
                                     for o in model.pipeline.stage_optimizers],
                "iterations": int(model.optimizer.iterations.numpy()),
            }


def uneven_batches(results):
    """Batches that num_microbatches=3 does not divide, against plain Keras.

    48 rows in batches of 20 (micro-batches of 7, 7, 6; the last batch of 8:
    3, 3, 2) and of 23 (the last batch of 2 rows: two micro-batches of 1),
    two epochs: the updates are the batches' mean gradients only if each
    micro-batch's gradient is weighted by its rows.
    """
    for batch_size in (20, 23):
        make = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
        model = mlp()
        compile_(model, make())
        history = model.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
        results[f"uneven_{batch_size}_plain"] = {"weights": weights(model),
                                                 "history": history.history}
        for schedule in ("gpipe", "1f1b", "layerpipe", "pipedream"):
            _, model = pipelined(schedule, make(), m=3)
            fit = model.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
            results[f"uneven_{batch_size}_{schedule}"] = {
                "weights": weights(model), "history": fit.history,
                "iterations": int(model.optimizer.iterations.numpy()),
                "stage_iterations": [int(o.iterations.numpy())
                                     for o in model.pipeline.stage_optimizers],
                "borrowed": list(model.pipeline.plan(1 + (batch_size - 1) // 3).borrowed)}


def linear_chain_reference(sched, x, y, w0, w1, lr):
    """NumPy reference of the action lists' semantics for two linear stages.

    Micro-batch m's forward on stage s uses the stage's weights after the
    updates that precede the forward in the stage's list (its backward uses
    the same, stashed weights); each update subtracts lr times the mean
    gradient of its micro-batches. Loss: mean squared error per micro-batch.
    """
    version, groups = [{}, {}], [[], []]
    for s, actions in enumerate(sched.actions):
        count = 0
        for a in actions:
            if a.kind == S.FORWARD:
                version[s][a.microbatch] = count
            elif a.kind == S.UPDATE:
                groups[s].append(a.microbatches)
                count += 1
    history = [[w0], [w1]]
    grads = {}
    xs = np.split(x, sched.total_microbatches)
    ys = np.split(y, sched.total_microbatches)

    def weight(s, v):
        while len(history[s]) <= v:
            g = groups[s][len(history[s]) - 1]
            mean = sum(gradient(s, m) for m in g) / len(g)
            history[s].append(history[s][-1] - lr * mean)
        return history[s][v]

    def gradient(s, m):
        if (s, m) not in grads:
            a, b = weight(0, version[0][m]), weight(1, version[1][m])
            h = xs[m] @ a
            out = h @ b
            d_out = 2 * (out - ys[m]) / out.size
            grads[(1, m)] = h.T @ d_out
            grads[(0, m)] = xs[m].T @ (d_out @ b.T)
        return grads[(s, m)]

    return [weight(0, len(groups[0])), weight(1, len(groups[1]))]


def asynchronous_semantics(results):
    """Every schedule over 4-step windows against the NumPy reference."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = rng.normal(size=(32, 2)).astype("float32")
    w0 = rng.normal(size=(6, 5)).astype("float32") * 0.5
    w1 = rng.normal(size=(5, 2)).astype("float32") * 0.5
    for schedule, extra in (("gpipe", {}), ("1f1b", {}), ("pipedream", {}),
                            ("layerpipe", {}), ("async", {"min_update_interval": 3})):
        strategy = PipelineStrategy(devices=DEVICES, num_microbatches=2, schedule=schedule,
                                    costs=[(1, 1, 1), (1, 1, 1)], **extra)
        model = keras.Sequential([keras.Input((6,)),
                                  keras.layers.Dense(5, use_bias=False),
                                  keras.layers.Dense(2, use_bias=False)])
        model.set_weights([w0, w1])
        model.compile(keras.optimizers.SGD(0.1), "mse", steps_per_execution=4)
        strategy.attach(model)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        # 4 steps of 2 micro-batches; "async" updates after 3, 3 and 2 of them.
        reference = linear_chain_reference(make_schedule(schedule, 2, 2, 4, **extra),
                                           x, y, w0, w1, 0.1)
        synchronous = linear_chain_reference(make_schedule("gpipe", 2, 2, 4),
                                             x, y, w0, w1, 0.1)
        results[f"async_{schedule}"] = {
            "got": [w.tolist() for w in model.get_weights()],
            "reference": [w.tolist() for w in reference],
            "synchronous": [w.tolist() for w in synchronous],
        }


def evaluate_predict_save(results):
    strategy, model = pipelined("layerpipe", keras.optimizers.SGD(0.1))
    model.fit(X, Y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    plain = mlp()
    compile_(plain, keras.optimizers.SGD(0.1))
    plain.set_weights(model.get_weights())
    got = model.predict(X[:10], batch_size=10, verbose=0)  # 10 rows, 4 micro-batches
    want = plain.predict(X[:10], batch_size=10, verbose=0)
    path = os.path.join(tempfile.mkdtemp(), "pipelined.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    results["predict"] = {
        "got": got.tolist(), "want": want.tolist(),
        "evaluate": model.evaluate(X, Y, batch_size=12, verbose=0),
        "evaluate_plain": plain.evaluate(X, Y, batch_size=12, verbose=0),
        "loaded": loaded.predict(X[:10], verbose=0).tolist(),
    }
    # The training graph places ops on both devices.
    window = model.pipeline._windows[12]  # batches of 12 rows
    batch = [(tf.constant(X[:12]), tf.constant(Y[:12]), None)]
    graph = window.get_concrete_function(batch).graph
    results["devices_used"] = sorted({op.device.split("/")[-1] for op in graph.get_operations()
                                      if op.device})


def bad_inputs(results):
    errors = {}

    def catch(key, fn):
        try:
            fn()
        except ValueError as error:
            errors[key] = str(error)

    catch("schedule", lambda: PipelineStrategy(devices=DEVICES, schedule="zb-v"))
    catch("device", lambda: PipelineStrategy(devices=["/cpu:0", "/cpu:7"]))

    def too_many_stages():
        strategy = PipelineStrategy(devices=DEVICES, num_microbatches=2)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        strategy.attach(model)
    catch("stages", too_many_stages)

    results["errors"] = errors


def main(path):
    results = {}
    for check in (synchronous_equivalence, uneven_batches, asynchronous_semantics,
                  evaluate_predict_save, bad_inputs):
        check(results)
    with open(path, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1])
