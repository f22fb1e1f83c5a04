"""SparseDense against Dense, a tf.sparse layer and SciPy, side by side.

    python benchmarks/sparse_dense_speed.py [--size 4096] [--per-column 32] [--batch 256]
        [--isa default|all|avx512|avx2|portable]

Measures, in one process and interleaved (medians of repeated runs):
  * a training step (forward, gradients, SGD update) of SparseDense (compiled
    kernels on each chosen variant, and TensorFlow's CSR ops: its GPU path),
    Dense, and a layer built on tf.sparse.sparse_dense_matmul;
  * inference of SparseDense, Dense and SciPy's CSR product (one thread).
Prints times, ratios, the issue's targets, and for every variant the roofline
bound of its kernels on this machine (benchmarks/roofline.py) with the
fraction of it SparseDense achieves.
"""

import argparse
import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.ops import SparsityPattern, kernels_available, sparse_matmul  # noqa: E402
from tfsparse.ops import kernels  # noqa: E402
import roofline  # noqa: E402
from timing import cpu_model, interleaved_medians  # noqa: E402


class TFSparseMatmulDense(keras.layers.Layer):
    """Baseline: the kernel as a tf.SparseTensor, tf.sparse.sparse_dense_matmul."""

    def __init__(self, pattern, values, **kwargs):
        super().__init__(**kwargs)
        self.units = pattern.shape[1]
        # W^T [units, input_dim] in row-major order = the pattern's column-major order.
        self.indices = tf.constant(np.stack([pattern.cols, pattern.rows], 1), tf.int64)
        self.dense_shape = (pattern.shape[1], pattern.shape[0])
        self.initial_values = values

    def build(self, input_shape):
        self.values = self.add_weight(
            "values", shape=self.initial_values.shape,
            initializer=keras.initializers.Constant(self.initial_values))
        self.bias = self.add_weight("bias", shape=(self.units,), initializer="zeros")

    def call(self, x):
        kernel_t = tf.SparseTensor(self.indices, self.values, self.dense_shape)
        y_t = tf.sparse.sparse_dense_matmul(kernel_t, x, adjoint_b=True)
        return tf.transpose(y_t) + self.bias


class TensorFlowOpsSparseDense(SparseDense):
    """SparseDense on TensorFlow's own CSR ops (its GPU and export path)."""

    def call(self, inputs):
        outputs = sparse_matmul(inputs, self.values, self.pattern_tensors(), use_kernel=False)
        return tf.nn.bias_add(outputs, self.bias)


def train_step_fn(layer, x, target, variant=None):
    """One SGD step as a zero-argument callable, traced under ``variant``."""
    optimizer = keras.optimizers.SGD(1e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(x) - target))
        grads = tape.gradient(loss, layer.trainable_weights)
        optimizer.apply_gradients(zip(grads, layer.trainable_weights))
        return loss

    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        step.get_concrete_function()
    return lambda: step().numpy()


def chosen_variants(isa):
    """The kernel variants to run: ``[None]`` is the default one."""
    if not kernels_available():
        return [None]
    if isa == "all":
        return list(kernels.supported_isas())
    return [None if isa == "default" else isa]


def sparse_dense_on(variant, n, matrix, x):
    """A built SparseDense whose kernels (traced under ``variant``) are known."""
    context = kernels.use_isa(variant) if variant else contextlib.nullcontext()
    with context:
        layer = SparseDense(n, pattern=matrix)
        layer(x[:1])
        return layer, kernels.isa()


def traced(variant, fn):
    """``fn`` as a tf.function traced under ``variant`` (its ops keep it)."""
    function = tf.function(fn)
    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        function()
    return function


def print_rooflines(sparse_names, train, infer, args, nnz):
    """Each variant's bounds on this machine and the fractions achieved."""
    n, batch = args.size, args.batch
    print(f"roofline bounds (benchmarks/roofline.py, {os.cpu_count()} threads; "
          f"fraction = bound / median time)")
    for name, variant in sparse_names.items():
        if variant is None:
            continue
        rates = roofline.measure(variant, os.cpu_count())
        forward, forward_by = roofline.spmm_bound(rates, variant, batch, n, n, nnz)
        sddmm, sddmm_by = roofline.sddmm_bound(rates, batch, n, n, nnz)
        step = 2 * forward + sddmm  # forward, input gradient (same shape), SDDMM
        print(f"  {name}: inference bound {forward * 1e3:.2f} ms ({forward_by}), "
              f"achieved {forward / infer[name]:.0%}; training-step kernels bound "
              f"{step * 1e3:.2f} ms (SDDMM: {sddmm_by}), achieved {step / train[name]:.0%}")
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--isa", default="default",
                        choices=("default", "all", *kernels.ISAS),
                        help="kernel variant(s) of SparseDense; 'all' runs every one "
                             "the CPU supports side by side")
    args = parser.parse_args()
    n, batch = args.size, args.batch
    pattern = SparsityPattern.random((n, n), args.per_column / n, seed=0)
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(pattern.nnz) / np.sqrt(args.per_column)).astype(np.float32)
    matrix = pattern.to_scipy(values)
    x = tf.constant(rng.standard_normal((batch, n)).astype(np.float32))
    target = tf.constant(rng.standard_normal((batch, n)).astype(np.float32))

    sparse = {}
    for variant in chosen_variants(args.isa):
        layer, used = sparse_dense_on(variant, n, matrix, x)
        sparse[f"SparseDense [{used or 'TF fallback'}]"] = (layer, used)
    tf_ops = TensorFlowOpsSparseDense(n, pattern=matrix)
    dense = keras.layers.Dense(n, kernel_initializer=keras.initializers.Constant(matrix.toarray()))
    tf_sparse = TFSparseMatmulDense(pattern, values)
    for layer in (tf_ops, dense, tf_sparse):
        layer(x[:1])
    print(f"kernel {n}x{n}, {args.per_column} nonzeros per column "
          f"(nnz={pattern.nnz}, density={pattern.density:.4%}), batch {batch}, float32; "
          f"compiled kernels: {kernels_available()}; CPU: {cpu_model()}; "
          f"{os.cpu_count()} CPUs; medians of {args.repeats} interleaved runs\n")

    train_steps = {name: train_step_fn(layer, x, target, used)
                   for name, (layer, used) in sparse.items()}
    train = interleaved_medians({
        **train_steps,
        "SparseDense on TF CSR ops (GPU path)": train_step_fn(tf_ops, x, target),
        "Dense": train_step_fn(dense, x, target),
        "tf.sparse.sparse_dense_matmul layer": train_step_fn(tf_sparse, x, target),
    }, repeats=args.repeats)

    x_numpy = x.numpy()
    predict = {name: traced(used, lambda layer=layer: layer(x))
               for name, (layer, used) in sparse.items()}
    predict["SparseDense on TF CSR ops (GPU path)"] = traced(None, lambda: tf_ops(x))
    predict["Dense"] = traced(None, lambda: dense(x))
    # What any layer called through a tf.function pays per call on this
    # machine, whatever it computes: the floor of the small batches.
    predict["tf.function returning x (call floor)"] = traced(None, lambda: tf.identity(x))
    # Every candidate ends with its product as a NumPy array, as SciPy's
    # does: np.asarray views a CPU tensor's buffer (Tensor.numpy() would add a
    # copy of the output to the TensorFlow candidates only).
    infer = interleaved_medians({
        **{name: (lambda f=f: np.asarray(f())) for name, f in predict.items()},
        "SciPy CSR (1 thread)": lambda: x_numpy @ matrix,
    }, repeats=args.repeats)

    for title, results in (("training step", train), ("inference", infer)):
        print_table(title, results, sparse)
    print_rooflines({name: used for name, (_, used) in sparse.items()}, train, infer, args,
                    pattern.nnz)
    for name in sparse:
        print_targets(name, train, infer)


def print_table(title, results, sparse):
    """Medians and how much faster each SparseDense variant is than each."""
    header = " ".join(f"{name.split()[-1] + ' faster by':>22}" for name in sparse)
    print(f"{title:<40} {'median ms':>10} {header}")
    for name, seconds in results.items():
        ratios = " ".join(f"{seconds / results[ref]:>21.2f}x" for ref in sparse)
        print(f"{name:<40} {seconds * 1e3:>10.3f} {ratios}")
    print()


def print_targets(name, train, infer):
    targets = [
        ("train step >= 6x faster than Dense", train["Dense"] / train[name], 6),
        ("train step >= 3x faster than tf.sparse layer",
         train["tf.sparse.sparse_dense_matmul layer"] / train[name], 3),
        ("inference >= 10x faster than Dense", infer["Dense"] / infer[name], 10),
        ("inference not slower than SciPy CSR", infer["SciPy CSR (1 thread)"] / infer[name], 1),
    ]
    for target, ratio, goal in targets:
        print(f"{'PASS' if ratio >= goal else 'FAIL'}  {name}: {target}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
