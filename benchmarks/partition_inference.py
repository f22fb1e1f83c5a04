"""Inference rate of a hypergraph-partitioned RadiX-Net: horovodrun -np 2 vs one process.

Run it plainly: it times the whole network in this process (SparseDense
layers, TensorFlow with ``--threads`` threads), then launches itself under
``horovodrun -np 2 -H localhost:2 --gloo`` (one TensorFlow thread per rank,
so both runs use the same cores) and times the partitioned model there. The
share of time in communication is ``1 - compute / total``, where compute is
the time of the same partitioned layers run on local inputs of the real
sizes without any message (zeros in place of the received values, no final
allgather), and total the time of the real partitioned forward pass. Rates are inputs
x edges / seconds, medians of ``--repeats`` runs.

Usage:
    python benchmarks/partition_inference.py [--neurons 1024] [--layers 24]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from tfsparse._keras import keras  # noqa: E402  (Keras 2 before Horovod)
import tensorflow as tf  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--neurons", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2,
                        help="TensorFlow threads of the one-process run")
    parser.add_argument("--worker", type=pathlib.Path, default=None,
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build(args):
    """RadiX-Net as SparseDense layers (ReLU, bias -0.3) and a sparse input."""
    from tfsparse.graphchallenge import radixnet
    from tfsparse.layers import SparseDense

    kernels = radixnet(args.neurons, args.layers, seed=0)
    model = keras.Sequential(
        [keras.Input((args.neurons,))]
        + [SparseDense(args.neurons, pattern=kernel, activation="relu",
                       bias_initializer=keras.initializers.Constant(-0.3))
           for kernel in kernels])
    rng = np.random.default_rng(0)
    x = (rng.random((args.batch, args.neurons)) < 0.1).astype(np.float32)
    return model, kernels, x


def median_seconds(function, x, repeats):
    function(x)  # trace
    function(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(function(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def worker(args):
    """Runs under horovodrun: times the partitioned forward and its exchanges."""
    import horovod.tensorflow as hvd

    from tfsparse.partition import partition_rows
    from tfsparse.partition.distributed import distribute

    hvd.init()
    model, kernels, x = build(args)
    partition = None
    if hvd.rank() == 0:
        partition = partition_rows(kernels, hvd.size(), "hypergraph")
    partition = hvd.broadcast_object(partition, root_rank=0)
    dist = distribute(model, partition)
    plans = dist.partition_plans
    forward = tf.function(lambda t: dist(t, training=False))
    rank = hvd.rank()

    @tf.function
    def compute_only(t):
        # The same layers on local inputs of the real sizes (owned values,
        # zeros for the received ones): the forward pass without messages.
        owned = tf.gather(t, plans[0].local_inputs, axis=1)
        for index, (layer, plan) in enumerate(zip(dist.partitioned_layers,
                                                  plans)):
            if index > 0:
                missing = int(plan.receive_counts.sum())
                owned = tf.concat([owned, tf.zeros((tf.shape(t)[0], missing))],
                                  axis=1)
            owned = layer.compute(owned)
        return owned

    seconds = median_seconds(forward, x, args.repeats)
    compute_seconds = median_seconds(compute_only, x, args.repeats)
    # Agreement with the whole model (every rank holds it).
    error = float(np.max(np.abs(forward(x).numpy() - model(x).numpy())))
    seconds = hvd.allreduce(tf.constant(seconds), op=hvd.Max).numpy()
    compute_seconds = hvd.allreduce(tf.constant(compute_seconds),
                                    op=hvd.Max).numpy()
    if rank == 0:
        args.worker.write_text(json.dumps({
            "seconds": float(seconds),
            "compute_seconds": float(compute_seconds),
            "max_error": error, "volume": partition.volume,
            "layer_volume_after_first": int(partition.layer_volume[1:].sum()),
            "imbalance": partition.imbalance}))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker is not None:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        worker(args)
        return 0
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    model, kernels, x = build(args)
    edges = sum(kernel.nnz for kernel in kernels)
    forward = tf.function(lambda t: model(t, training=False))
    single = median_seconds(forward, x, args.repeats)

    with tempfile.TemporaryDirectory() as folder:
        result_path = pathlib.Path(folder) / "result.json"
        horovodrun = pathlib.Path(sys.executable).parent / "horovodrun"
        command = [str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo",
                   sys.executable, __file__, "--worker", str(result_path),
                   "--neurons", str(args.neurons), "--layers",
                   str(args.layers), "--batch", str(args.batch),
                   "--repeats", str(args.repeats)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
        result = json.loads(result_path.read_text())

    rate = args.batch * edges
    print(f"RadiX-Net {args.neurons}x{args.layers} ({edges} edges), "
          f"{args.batch} inputs, forward pass (inference), medians of "
          f"{args.repeats}")
    print("| run | seconds | edges/s | communication share |")
    print("|---|---:|---:|---:|")
    print(f"| one process, {args.threads} threads | {single:.4f} | "
          f"{rate / single:.3e} | - |")
    print(f"| horovodrun -np 2 (1 thread each), hypergraph partition | "
          f"{result['seconds']:.4f} | {rate / result['seconds']:.3e} | "
          f"{1 - result['compute_seconds'] / result['seconds']:.1%} |")
    print(f"ratio (2 ranks / one process): "
          f"{single / result['seconds']:.2f}x the rate")
    print(f"partition: volume {result['volume']} words/sample "
          f"({result['layer_volume_after_first']} sent, the first layer "
          f"reads the replicated batch), imbalance {result['imbalance']:.4f}; "
          f"max |partitioned - whole| = {result['max_error']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
