"""Pipelined training of a sparse MLP on real MNIST digits with PipelineStrategy.

    python examples/pipeline_mnist.py [--schedule layerpipe] [--epochs 3]
        [--microbatches 4] [--out out/pipeline_mnist]

Makes two logical CPU devices (on a GPU machine pass ``--gpus`` to use the
GPUs), measures every layer's costs with ``tfsparse.distribute.profile``,
predicts every schedule with the simulator (cycles, bubble, Gantt chart of
the chosen one), then compiles the 784-512-256-10 MLP (SparseDense hidden
layers), attaches it to the strategy (``strategy.attach(model)``: this
model's ``fit``, ``evaluate`` and ``predict`` run the pipeline), trains it
with ``model.fit`` on the chosen schedule, evaluates it, saves it and checks
the reloaded model predicts the same.

One stage per process, over Horovod, each stage's SparseDense layers
partitioned over two local devices (``--local-devices 1``: one device each):

    horovodrun -np 2 -H localhost:2 --gloo python examples/pipeline_mnist.py \
        --horovod --local-devices 2
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def make_devices(use_gpus, count=2):
    if use_gpus and tf.config.list_physical_devices("GPU"):
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # tfsparse.distribute.SCHEDULES (imported below, after the devices are set)
    parser.add_argument("--schedule", default="layerpipe",
                        choices=("gpipe", "1f1b", "pipedream", "layerpipe", "async"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=80)
    parser.add_argument("--gpus", action="store_true")
    parser.add_argument("--horovod", action="store_true",
                        help="one stage per horovodrun process")
    parser.add_argument("--local-devices", type=int, default=1,
                        help="with --horovod: devices per process (CPUs are split)")
    parser.add_argument("--out", default="out/pipeline_mnist")
    args = parser.parse_args()
    for option in ("epochs", "microbatches", "batch_size", "local_devices"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1, received "
                         f"{getattr(args, option)}")
    if args.microbatches > args.batch_size:  # any other count: micro-batches differ by a row
        parser.error(f"--microbatches must be at most --batch-size={args.batch_size}, received "
                     f"{args.microbatches}")
    # Before TensorFlow initialises its devices.
    devices = make_devices(args.gpus, args.local_devices if args.horovod else 2)

    import tfsparse  # noqa: F401  (selects tf_keras before Horovod imports Keras)
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

    rank, say = 0, print
    if args.horovod:
        import horovod.tensorflow as hvd

        hvd.init()
        rank, stages = hvd.rank(), hvd.size()
        local = devices[:args.local_devices]
        placement = dict(devices="horovod", local_devices=local)
        say = print if rank == 0 else (lambda *a, **k: None)
        say(f"{stages} processes, one stage each, on {local} in every process")
    else:
        stages, placement = len(devices), dict(devices=devices)
        print(f"Devices: {devices}")

    rows = -(-args.batch_size // args.microbatches)  # the largest micro-batch
    costs = profile(build(), x_train[:rows])  # under Horovod, rank 0's are used
    say("Measured seconds per micro-batch (forward, activation gradient, weight gradient):")
    for index, triple in enumerate(costs):
        say(f"  layer {index}: " + ", ".join(f"{c * 1e3:.3f} ms" for c in triple))
    steps = 10
    say(f"\nSimulated, {stages} stages, {args.microbatches} micro-batches, "
        f"windows of {steps} steps:")
    for name in SCHEDULES:
        result = simulate(name, costs, stages, args.microbatches, steps)
        say(f"  {name:9s} {result.cycles * 1e3:8.2f} ms  bubble {result.bubble_fraction:6.1%}"
            f"  peak activations {list(result.peak_activations)}")

    strategy = PipelineStrategy(num_microbatches=args.microbatches, schedule=args.schedule,
                                costs=costs, **placement)
    model = build()
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps)
    strategy.attach(model)  # this model's fit, evaluate, predict run the pipeline
    os.makedirs(args.out, exist_ok=True)
    prediction = strategy.simulate(model, args.batch_size, steps=steps)
    if rank == 0:
        chart = plot_gantt(prediction, os.path.join(args.out, f"gantt_{args.schedule}.png"))
        print(f"\nPlan: stages {prediction.plan.stages}, rows borrowed "
              f"{[round(b, 3) for b in prediction.plan.borrowed]}; Gantt chart: {chart}")

    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              verbose=2 if rank == 0 else 0)
    # Under Horovod every process gets the same results (and weights).
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
    say(f"\n{args.schedule}: test accuracy {accuracy:.2%} after {args.epochs} epochs")
    if args.horovod:
        # Each process partitions its own stage; rank 0 gathers and prints the
        # reports (horovodrun can drop a rank's last output lines as it exits).
        # The plan follows the measured costs, so a stage may hold no
        # SparseDense layer (only the Dense classifier): it says so.
        mine = [f"rank {rank}: stage {stage} partitioned into "
                + ", ".join(f"{p.k} parts ({p.volume} words per sample)" for p in parts)
                for stage, parts in model.pipeline.partitions().items()]
        mine = mine or [f"rank {rank}: stage {rank} holds no SparseDense layer to partition"]
        for report in hvd.allgather_object(mine):
            for line in report:
                say(line)
    if rank != 0:
        model.predict(x_test[:100], verbose=0)  # rank 0's predict needs every stage
        return
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
