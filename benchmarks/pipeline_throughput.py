"""PipelineStrategy measured: throughput on 2 devices vs 1, with the simulator's prediction, and convergence.

Throughput: a sparse MLP (784-2048-2048-2048-10, SparseDense at 5%) and a
Graph Challenge slice (RadiX-Net 1024 neurons x 8 layers, regression to
random targets) train with every schedule on two logical CPU devices, side
by side in one process with the same model on one device: plain Keras
``fit`` (no pipeline), and the pipeline with one stage (every action in
turn, the serial execution the simulator assumes for one device).
TensorFlow runs each op on one thread (``intra_op_parallelism_threads=1``)
and up to two ops at once (``inter_op_parallelism_threads=2``). Logical CPU
devices share those threads: plain Keras also runs independent ops (a
layer's input and weight gradients) at the same time. Next to each
measurement: the simulator's prediction for the same run, from the layers'
costs measured by ``profile`` on this CPU (seconds per micro-batch) and the
exact stage plan the strategy executes. Medians of interleaved repeats.
The last row trains one stage whose SparseDense layers are row-partitioned
over both devices (``devices=[["/cpu:0", "/cpu:1"]]``); its prediction
counts those layers at half their cost and ignores the exchange.

Convergence: on the shipped MNIST sample (4,000 training, 1,000 test digits)
a 784-512-256-10 MLP (SparseDense at 10%, then Dense) trains for the same
number of epochs without a pipeline and with every schedule (two devices,
windows of 10 steps, so the asynchronous schedules really use stale
weights); every schedule should end within 1 point of the test accuracy of
training without a pipeline.

Usage:
    python benchmarks/pipeline_throughput.py [--part throughput|convergence|both]
        [--repeats 5] [--epochs 8] [--out out/pipeline]
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

from tqdm.auto import tqdm  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.distribute import SCHEDULES  # noqa: E402
from tfsparse.distribute import PipelineStrategy  # noqa: E402
from tfsparse.distribute import profile  # noqa: E402
from tfsparse.graphchallenge import radixnet  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402

DEVICES = ["/cpu:0", "/cpu:1"]
BATCH, MICROBATCHES, WINDOW = 512, 4, 4


def sparse_mlp():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((784,))] + [
        SparseDense(2048, density=0.05, seed=i, activation="relu") for i in range(3)]
        + [keras.layers.Dense(10)])


def challenge_slice():
    return keras.Sequential([keras.Input((1024,))] + [
        SparseDense(1024, pattern=w, activation="relu") for w in radixnet(1024, 8, seed=0)])


NETWORKS = {
    "sparse-mlp": (sparse_mlp, 784, "classification"),
    "challenge-1024x8": (challenge_slice, 1024, "regression"),
}


def data_for(inputs, task, steps):
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * steps, inputs), "float32")
    if task == "classification":
        return x, rng.integers(0, 10, BATCH * steps), keras.losses.SparseCategoricalCrossentropy(
            from_logits=True)
    return x, rng.random((BATCH * steps, 1024), "float32"), "mse"


def throughput(args):
    results = {}
    steps = 2 * WINDOW
    for network, (build, inputs, task) in NETWORKS.items():
        x, y, loss = data_for(inputs, task, steps)
        costs = profile(build(), x[:BATCH // MICROBATCHES], repeats=15)
        runs = {}
        plain = build()
        plain.compile(keras.optimizers.SGD(0.01), loss, steps_per_execution=WINDOW)
        runs["1 device (no pipeline)"] = plain
        # One device runs every layer of every micro-batch in turn.
        predicted = {"1 device (no pipeline)": BATCH / (MICROBATCHES * sum(map(sum, costs)))}
        configurations = [("1 device, 1 stage", DEVICES[:1], "gpipe")] + [
            (schedule, DEVICES, schedule) for schedule in SCHEDULES] + [
            # One stage whose SparseDense layers are row-partitioned over both
            # devices (hypergraph partition), instead of two stages.
            ("1 stage partitioned over 2 devices", [DEVICES], "gpipe")]
        for label, devices, schedule in tqdm(configurations, desc=f"{network}: trace",
                                             leave=False):
            strategy = PipelineStrategy(devices=devices, num_microbatches=MICROBATCHES,
                                        schedule=schedule, costs=costs)
            model = build()
            model.compile(keras.optimizers.SGD(0.01), loss, steps_per_execution=WINDOW)
            strategy.attach(model)
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # trace
            simulated = strategy.simulate(model, BATCH, steps=WINDOW)
            predicted[label] = WINDOW * BATCH / simulated.cycles
            runs[label] = model
        plain.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        samples = {name: [] for name in runs}
        cores = {name: [] for name in runs}
        for _ in tqdm(range(args.repeats), desc=f"{network}: time", leave=False):
            for name, model in runs.items():
                start, cpu = time.perf_counter(), time.process_time()
                model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
                wall = time.perf_counter() - start
                samples[name].append(len(x) / wall)
                cores[name].append((time.process_time() - cpu) / wall)
        measured = {name: float(np.median(v)) for name, v in samples.items()}
        used = {name: float(np.median(v)) for name, v in cores.items()}
        results[network] = {"measured": measured, "predicted": predicted, "costs": costs,
                            "samples": samples, "cores_used": used}
        base, base_predicted = measured["1 device (no pipeline)"], predicted["1 device (no pipeline)"]
        print(f"\n{network}: batch {BATCH}, {MICROBATCHES} micro-batches, windows of "
              f"{WINDOW} steps, samples/s (median of {args.repeats})\n")
        print("| run | measured (min-max) | predicted | measured vs 1 device "
              "| predicted vs 1 device | cores used |")
        print("|---|---|---|---|---|---|")
        for name in runs:
            print(f"| {name} | {measured[name]:.0f} ({min(samples[name]):.0f}-"
                  f"{max(samples[name]):.0f}) | {predicted[name]:.0f} | "
                  f"{measured[name] / base:.2f}x | {predicted[name] / base_predicted:.2f}x | "
                  f"{used[name]:.2f} |")
        print("\n(cores used: the process's CPU time / wall time; a pipeline on two "
              "devices can only beat one device when it gets more than one core)")
    return results


def convergence(args):
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255

    def build():
        keras.utils.set_random_seed(7)
        return keras.Sequential([
            keras.Input((784,)),
            SparseDense(512, density=0.1, seed=1, activation="relu"),
            SparseDense(256, density=0.1, seed=2, activation="relu"),
            keras.layers.Dense(10),
        ])

    def built_and_compiled():
        model = build()
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=10)
        return model

    def run(model):
        model.fit(x_train, y_train, batch_size=80, epochs=args.epochs, verbose=0)
        return float(model.evaluate(x_test, y_test, batch_size=500, verbose=0)[1])

    accuracy = {"no pipeline": run(built_and_compiled())}
    for schedule in tqdm(SCHEDULES, desc="convergence"):
        strategy = PipelineStrategy(devices=DEVICES, num_microbatches=4, schedule=schedule)
        model = strategy.attach(built_and_compiled())
        accuracy[schedule] = run(model)
    print(f"\nMNIST sample, {args.epochs} epochs, batch 80 = 4 micro-batches, "
          "windows of 10 steps, test accuracy\n")
    print("| training | test accuracy | vs no pipeline |")
    print("|---|---|---|")
    for name, value in accuracy.items():
        delta = 100 * (value - accuracy["no pipeline"])
        print(f"| {name} | {value:.2%} | {delta:+.1f} points |")
    worst = min(accuracy.values()) - accuracy["no pipeline"]
    print(f"\nEvery schedule within 1 point: {'YES' if worst >= -0.01 else 'NO'} "
          f"(worst {100 * worst:+.1f} points)")
    return accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("throughput", "convergence", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="out/pipeline")
    args = parser.parse_args()
    results = {}
    if args.part in ("throughput", "both"):
        results["throughput"] = throughput(args)
    if args.part in ("convergence", "both"):
        results["convergence"] = convergence(args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"pipeline_{args.part}.json")
    with open(path, "w") as handle:
        json.dump(results, handle, indent=1)
    print(f"Written: {path}")


if __name__ == "__main__":
    main()
