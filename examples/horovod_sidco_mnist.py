"""Train an MNIST classifier on Horovod workers with SIDCo-compressed gradients.

Each worker trains on its shard of the data; after every backward pass it
sends only the gradient elements above SIDCo's estimated threshold (about
``--ratio`` of them, with error feedback), allgathered by Horovod, instead of
allreducing the dense gradients.

On this machine, two workers (Gloo over loopback; what ``make demo`` runs):

    horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_sidco_mnist.py

On a cluster, e.g. two machines with four workers each:

    # Gloo (what tools/build_horovod.sh builds): horovodrun starts the workers
    # over passwordless ssh; every host needs the same Python environment at
    # the same path and this repository (or tfsparse installed).
    horovodrun -np 8 -H host1:4,host2:4 --gloo --network-interface eth0 \\
        python examples/horovod_sidco_mnist.py --data /shared/mnist.npz

    # MPI (Horovod built with HOROVOD_WITH_MPI=1):
    horovodrun -np 8 -H host1:4,host2:4 --mpi python examples/horovod_sidco_mnist.py
    # or directly with Open MPI:
    mpirun -np 8 -H host1:4,host2:4 -bind-to none -map-by slot \\
        -x PATH -x LD_LIBRARY_PATH python examples/horovod_sidco_mnist.py

With GPUs, pin one GPU per worker (``CUDA_VISIBLE_DEVICES`` or
``tf.config.set_visible_devices`` with ``hvd.local_rank()``); the compression
itself runs on whichever device holds the gradients.

Without ``--data`` the 5,000 real MNIST digits shipped with tfsparse are used
(``tfsparse.data.load_mnist_sample``); ``--data`` reads the full set from local
files (``tfsparse.data.load_mnist``). ``--compressor none`` trains the same
model with a dense allreduce for comparison; ``--json`` writes rank 0's
results (accuracy, bytes per step, step and exchange times) for
``benchmarks/compression_convergence.py``.
"""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repo's callbacks/

import tfsparse  # noqa: F401  (selects Keras 2 before TensorFlow resolves tf.keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402

from callbacks.compression_monitor import CompressionMonitor  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse import compression  # noqa: E402
from tfsparse.data import load_mnist  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.horovod import DistributedOptimizer  # noqa: E402
from tfsparse.horovod import MetricAverageCallback  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compressor", default="sidco",
                        choices=["sidco", "topk", "dgc", "randomk", "none"])
    parser.add_argument("--ratio", type=float, default=0.01, help="fraction of gradient elements sent")
    parser.add_argument("--distribution", default="exponential",
                        choices=["exponential", "gpareto", "gamma"])
    parser.add_argument("--fused", action="store_true", help="compress all gradients as one buffer")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--data", default=None, help="full MNIST (IDX folder or mnist.npz); default: shipped sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="PNG of estimation quality and bytes (rank 0)")
    parser.add_argument("--json", default=None, help="write rank 0's results here")
    args = parser.parse_args(argv)
    checks.check_command_line(parser, args, {
        "ratio": checks.check_fraction, "epochs": checks.check_positive_int,
        "batch_size": checks.check_positive_int, "learning_rate": checks.check_positive_float,
        "seed": checks.check_non_negative_int})
    if args.data is not None and not pathlib.Path(args.data).exists():
        parser.error(f"--data: {args.data} does not exist")
    return args


def make_compressor(args):
    if args.compressor == "sidco":
        return compression.SIDCo(args.ratio, distribution=args.distribution)
    if args.compressor == "topk":
        return compression.TopK(args.ratio)
    if args.compressor == "dgc":
        return compression.DGC(args.ratio, seed=args.seed)
    if args.compressor == "randomk":
        return compression.RandomK(args.ratio, seed=args.seed)
    return compression.NoCompression()


def load_data(args):
    (x_train, y_train), (x_test, y_test) = (
        load_mnist(args.data) if args.data else load_mnist_sample(seed=args.seed)
    )
    x_train = x_train.reshape(len(x_train), -1).astype(np.float32) / 255.0
    x_test = x_test.reshape(len(x_test), -1).astype(np.float32) / 255.0
    # Each worker trains on its own shard.
    shard = slice(hvd.rank(), None, hvd.size())
    return (x_train[shard], y_train[shard].astype(np.int32)), (x_test, y_test.astype(np.int32))


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.layers.Dense(256, activation="relu", input_shape=(784,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


class StepTimer(keras.callbacks.Callback):
    """Wall time of every training step and the exchange time inside it."""

    def __init__(self):
        super().__init__()
        self.step_times, self.exchange_times = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_times.append(time.perf_counter() - self._start)
        stats = self.model.optimizer.compression_stats
        self.exchange_times.append(float(stats["exchange_time"].numpy()))


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    (x_train, y_train), (x_test, y_test) = load_data(args)
    model = make_model(args.seed + hvd.rank())  # different starts: the broadcast aligns them
    compressor = make_compressor(args)
    optimizer = DistributedOptimizer(
        keras.optimizers.Adam(args.learning_rate), compression=compressor, fused=args.fused
    )
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    timer = StepTimer()
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        CompressionMonitor(plot_path=args.plot if hvd.rank() == 0 else None),
        timer,
        MetricAverageCallback(),
    ]
    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        shuffle=True, verbose=2 if hvd.rank() == 0 else 0, callbacks=callbacks)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    steps_per_epoch = len(timer.step_times) // args.epochs
    # Leave out the first epoch (tracing, warm-up); of a single one, its first step.
    later = slice(steps_per_epoch if args.epochs > 1 else 1, None)
    result = {
        "compressor": repr(compressor),
        "workers": hvd.size(),
        "epochs": args.epochs,
        "test_accuracy": float(accuracy),
        "test_loss": float(loss),
        "train_loss": [float(v) for v in history.history["loss"]],
        "bytes_sent_per_step": float(history.history["compression_bytes_sent"][-1]),
        "dense_bytes_per_step": float(history.history["compression_dense_bytes"][-1]),
        "estimation_quality": float(history.history["compression_quality"][-1]),
        "step_time_s": float(np.median(timer.step_times[later])),
        "exchange_time_s": float(np.median(timer.exchange_times[later])),
        "compression_time_s": float(history.history["compression_time"][-1]),
    }
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f}; bytes sent per step per worker "
              f"{result['bytes_sent_per_step']:.0f} of {result['dense_bytes_per_step']:.0f} dense")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
