"""Pipelined training of a sparse MLP on real MNIST digits with PipelineStrategy.

    python examples/pipeline_mnist.py [--schedule layerpipe] [--epochs 3]
        [--microbatches 4] [--out out/pipeline_mnist]

Makes two logical CPU devices (on a GPU machine pass ``--gpus`` to use the
GPUs), measures every layer's costs with ``tfsparse.distribute.profile``,
predicts every schedule with the simulator (cycles, bubble, Gantt chart of
the chosen one), then trains the 784-512-256-10 MLP (SparseDense hidden
layers) with ``model.fit`` on the chosen schedule, evaluates it, saves it
and checks the reloaded model predicts the same.
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def make_devices(use_gpus):
    if use_gpus and tf.config.list_physical_devices("GPU"):
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedule", default="layerpipe")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=80)
    parser.add_argument("--gpus", action="store_true")
    parser.add_argument("--out", default="out/pipeline_mnist")
    args = parser.parse_args()
    devices = make_devices(args.gpus)  # before TensorFlow initialises its devices

    from tfsparse import SparseDense
    from tfsparse import keras
    from tfsparse.data import load_mnist_sample
    from tfsparse.distribute import SCHEDULES
    from tfsparse.distribute import PipelineStrategy
    from tfsparse.distribute import plot_gantt
    from tfsparse.distribute import profile
    from tfsparse.distribute import simulate

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

    rows = args.batch_size // args.microbatches
    costs = profile(build(), x_train[:rows])
    print(f"Devices: {devices}")
    print("Measured seconds per micro-batch (forward, activation gradient, weight gradient):")
    for index, triple in enumerate(costs):
        print(f"  layer {index}: " + ", ".join(f"{c * 1e3:.3f} ms" for c in triple))
    steps = 10
    print(f"\nSimulated, {len(devices)} stages, {args.microbatches} micro-batches, "
          f"windows of {steps} steps:")
    for name in SCHEDULES:
        result = simulate(name, costs, len(devices), args.microbatches, steps)
        print(f"  {name:9s} {result.cycles * 1e3:8.2f} ms  bubble {result.bubble_fraction:6.1%}"
              f"  peak activations {list(result.peak_activations)}")

    strategy = PipelineStrategy(devices=devices, num_microbatches=args.microbatches,
                                schedule=args.schedule, costs=costs)
    with strategy.scope():
        model = build()
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps)
    os.makedirs(args.out, exist_ok=True)
    prediction = strategy.simulate(model, args.batch_size, steps=steps)
    chart = plot_gantt(prediction, os.path.join(args.out, f"gantt_{args.schedule}.png"))
    print(f"\nPlan: stages {prediction.plan.stages}, rows borrowed "
          f"{[round(b, 3) for b in prediction.plan.borrowed]}; Gantt chart: {chart}")

    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
    print(f"\n{args.schedule}: test accuracy {accuracy:.2%} after {args.epochs} epochs")
    path = os.path.join(args.out, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    same = np.allclose(loaded.predict(x_test[:100], verbose=0),
                       model.predict(x_test[:100], verbose=0), atol=1e-5)
    print(f"Saved to {path}; the reloaded model predicts the same: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
