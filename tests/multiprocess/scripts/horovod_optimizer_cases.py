"""Run by tests/multiprocess/test_horovod_compression.py under horovodrun -np 2.

For every case of ``CASES`` (each compressor, ``op``, ``backward_passes_per_step``)
each rank applies known gradients (a dense one and an embedding's
``tf.IndexedSlices``) through ``DistributedOptimizer(SGD(1.0))`` and writes,
for every pass, the weights and residuals before and after into
``rank<r>.npz`` in the folder given as the first argument; the test rebuilds
what 2 ranks should compute with NumPy.
"""

import os
import sys

import tfsparse  # noqa: F401  (selects Keras 2 before TensorFlow resolves tf.keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse import keras  # noqa: E402
from tfsparse.compression import DGC  # noqa: E402
from tfsparse.compression import NoCompression  # noqa: E402
from tfsparse.compression import RandomK  # noqa: E402
from tfsparse.compression import SIDCo  # noqa: E402
from tfsparse.compression import TopK  # noqa: E402
from tfsparse.horovod import DistributedOptimizer  # noqa: E402

DENSE_SIZE = 300
TABLE_SHAPE = (40, 4)
LOOKUPS = 12  # rows looked up per pass, drawn with repetition
PASSES = 4

#: name -> DistributedOptimizer arguments (a factory, so every run gets fresh state).
CASES = {
    "none": lambda: dict(compression=NoCompression()),
    "none_sum": lambda: dict(compression=NoCompression(), op=hvd.Sum),
    "topk": lambda: dict(compression=TopK(0.1)),
    "topk_sum": lambda: dict(compression=TopK(0.1), op=hvd.Sum),
    "sidco": lambda: dict(compression=SIDCo(0.05)),
    "sidco_gamma": lambda: dict(compression=SIDCo(0.05, distribution="gamma")),
    "dgc": lambda: dict(compression=DGC(0.05, sample_ratio=0.5)),
    "randomk": lambda: dict(compression=RandomK(0.1, seed=3)),
    # Summing IndexedSlices over passes needs sparse_as_dense=True, as in Horovod.
    "topk_passes": lambda: dict(compression=TopK(0.1), backward_passes_per_step=2,
                                sparse_as_dense=True),
    "none_sum_passes_mean": lambda: dict(compression=NoCompression(), op=hvd.Sum,
                                         backward_passes_per_step=2,
                                         average_aggregated_gradients=True,
                                         sparse_as_dense=True),
    "sidco_passes_sparse_as_dense": lambda: dict(compression=SIDCo(0.05),
                                                 backward_passes_per_step=2,
                                                 sparse_as_dense=True),
}


def pass_gradients(rank, step):
    """The dense gradient, looked-up rows and their values of `rank` at pass `step`."""
    rng = np.random.default_rng([rank, step])
    dense = rng.laplace(size=DENSE_SIZE).astype(np.float32)
    rows = rng.integers(0, TABLE_SHAPE[0], size=LOOKUPS)
    values = rng.laplace(size=(LOOKUPS, TABLE_SHAPE[1])).astype(np.float32)
    return dense, rows, values


def residuals_by_variable(optimizer, variables):
    """Each variable's residual now (zeros before the first exchange or without compression)."""
    found = {}
    for feedback in optimizer.compression_exchange.feedbacks:
        for name, residual in zip(feedback.variable_names, feedback.residuals):
            found[name] = residual.numpy()
    return [found.get(v.name, np.zeros(v.shape, np.float32)) for v in variables]


def run_case(name, rank):
    initial = np.random.default_rng(99)  # the same start on both ranks
    variables = [
        tf.Variable(initial.normal(size=DENSE_SIZE).astype(np.float32), name=f"{name}_dense"),
        tf.Variable(initial.normal(size=TABLE_SHAPE).astype(np.float32), name=f"{name}_table"),
    ]
    optimizer = DistributedOptimizer(keras.optimizers.SGD(1.0), **CASES[name]())

    @tf.function
    def apply(dense, rows, values):
        table = tf.IndexedSlices(values, rows, tf.constant(TABLE_SHAPE, tf.int64))
        optimizer.apply_gradients(zip([dense, table], variables))

    arrays = {}
    for step in range(PASSES):
        before = [v.numpy() for v in variables], residuals_by_variable(optimizer, variables)
        apply(*(tf.constant(a) for a in pass_gradients(rank, step)))
        after = [v.numpy() for v in variables], residuals_by_variable(optimizer, variables)
        for index in range(len(variables)):
            arrays[f"{name}/{step}/weights_before/{index}"] = before[0][index]
            arrays[f"{name}/{step}/weights_after/{index}"] = after[0][index]
            arrays[f"{name}/{step}/residual_before/{index}"] = before[1][index]
            arrays[f"{name}/{step}/residual_after/{index}"] = after[1][index]
    return arrays


def main(out):
    hvd.init()
    rank = hvd.rank()
    arrays = {}
    for name in CASES:
        arrays.update(run_case(name, rank))
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        handle.write(f'{{"size": {hvd.size()}}}')


if __name__ == "__main__":
    main(sys.argv[1])
