"""Run by tests/multiprocess/test_dynamic_sparsity_processes.py under horovodrun -np 2.

Each rank trains the same SparseConv2D + SparseDense model on its own data shard with
tfsparse.horovod.DistributedOptimizer and callbacks.DynamicSparsity, then
writes ``rank<r>.npz`` (patterns, values, residuals per run) and
``rank<r>.json`` (the updates) into the folder given as first argument.
"""

import json
import os
import sys

import tfsparse  # noqa: F401  (selects Keras 2 before TensorFlow resolves tf.keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402

from callbacks import DynamicSparsity  # noqa: E402
from horovod_compression import rank_data  # noqa: E402  (this folder: the same shards)
from tfsparse import keras  # noqa: E402
from tfsparse.compression import NoCompression  # noqa: E402
from tfsparse.compression import SIDCo  # noqa: E402
from tfsparse.compression import TopK  # noqa: E402
from tfsparse.dynamic import _optimizer_state  # noqa: E402
from tfsparse.horovod import DistributedOptimizer  # noqa: E402
from tfsparse.layers import SparseConv2D  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402

RUNS = {  # name: (method, compressor)
    "rigl_topk": ("rigl", TopK(0.25)),
    "rigl_sidco": ("rigl", SIDCo(0.1)),
    "rigl_dense": ("rigl", NoCompression()),
    "set_topk": ("set", TopK(0.25)),
}


def run(method, compressor):
    keras.utils.set_random_seed(rank_seed := 7)
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Reshape((5, 4, 1)),
        SparseConv2D(4, 2, padding="same", density=0.5, seed=rank_seed, activation="relu",
                     name="conv"),
        keras.layers.Flatten(),
        SparseDense(32, density=0.2, seed=rank_seed, activation="relu", name="hidden"),
        SparseDense(2, density=0.5, seed=rank_seed + 1, name="out"),
    ])
    # The compressor is passed positionally: its keyword is being renamed.
    optimizer = DistributedOptimizer(keras.optimizers.Adam(0.01), compressor)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = rank_data(hvd.rank(), n=256)
    sparse = [layer for layer in model.layers if isinstance(layer, (SparseConv2D, SparseDense))]
    initial = [layer.pattern for layer in sparse]
    callback = DynamicSparsity(method, update_every=4, drop_fraction=0.5, end_step=0.9, seed=3)
    model.fit(x, y, epochs=3, batch_size=32, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), callback])
    arrays = {}
    for layer in sparse:
        arrays[f"{layer.name}_rows"] = layer.pattern_rows.numpy()
        arrays[f"{layer.name}_cols"] = layer.pattern_cols.numpy()
        arrays[f"{layer.name}_values"] = layer.values.numpy()
        residual = _optimizer_state.residual_of(model.optimizer, layer.values)
        if residual is not None:
            arrays[f"{layer.name}_residual"] = residual.numpy()
    moved = [layer.pattern != start for layer, start in zip(sparse, initial)]
    return arrays, dict(updates=[u["step"] for u in callback.updates], moved=moved)


def main():
    hvd.init()
    out = sys.argv[1]
    arrays, summary = {}, {"size": hvd.size()}
    for name, (method, compressor) in RUNS.items():
        run_arrays, summary[name] = run(method, compressor)
        arrays.update({f"{name}/{key}": value for key, value in run_arrays.items()})
    np.savez(os.path.join(out, f"rank{hvd.rank()}.npz"), **arrays)
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as handle:
        json.dump(summary, handle)


if __name__ == "__main__":
    main()
