"""Train a sparse MNIST MLP whose weights are split over Horovod ranks.

Each rank holds only the fan-in weights of the neurons a hypergraph partition
gives it; before each layer it receives exactly the activations it needs
(``hvd.alltoall``), and ``model.fit`` trains the partitioned model. At the
end the weights are collected into the whole model, which is evaluated and
saved by rank 0.

Usage:
    horovodrun -np 2 -H localhost:2 --gloo python examples/partitioned_training.py
    python examples/partitioned_training.py          # one rank works too
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfsparse._keras import keras  # noqa: E402  (Keras 2 before Horovod)
import horovod.tensorflow as hvd  # noqa: E402

from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.partition import partition_rows  # noqa: E402
from tfsparse.partition.distributed import collect_weights  # noqa: E402
from tfsparse.partition.distributed import distribute  # noqa: E402
from tfsparse import _validation as checks  # noqa: E402  (the options' checks)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--save", default="out/partitioned_training/partitioned_mlp.keras")
    args = parser.parse_args(argv)
    checks.check_command_line(parser, args, {
        "epochs": checks.check_positive_int, "density": checks.check_fraction})

    hvd.init()
    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train.reshape(-1, 784).astype("float32") / 255.0
    x_test = x_test.reshape(-1, 784).astype("float32") / 255.0

    # The same model on every rank: seeded patterns, rank 0's initial values.
    model = keras.Sequential([
        keras.Input((784,)),
        SparseDense(256, density=args.density, seed=1, activation="relu"),
        SparseDense(256, density=args.density, seed=2, activation="relu"),
        SparseDense(10, density=0.5, seed=3),
    ])
    hvd.broadcast_variables(model.variables, root_rank=0)

    # Partition once (Mt-KaHyPar may differ run to run) and share it.
    partition = None
    if hvd.rank() == 0:
        partition = partition_rows(model, hvd.size(), "hypergraph")
        print(partition)
        print(partition.layer_table())
    partition = hvd.broadcast_object(partition, root_rank=0)

    distributed = distribute(model, partition)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # A plain optimizer: the weights are split, not replicated.
    distributed.compile(keras.optimizers.Adam(1e-3), loss, metrics=["accuracy"])
    distributed.fit(x_train, y_train, batch_size=64, epochs=args.epochs,
                    shuffle=False, verbose=2 if hvd.rank() == 0 else 0)

    collect_weights(distributed, model)
    model.compile(loss=loss, metrics=["accuracy"])
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        print(f"test accuracy of the collected model: {accuracy:.3f}")
        os.makedirs(os.path.dirname(args.save) or ".", exist_ok=True)
        model.save(args.save)
        print(f"saved {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
