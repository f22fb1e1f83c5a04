"""SparseDense against Dense, a tf.sparse layer and SciPy, side by side.

    python benchmarks/sparse_dense_speed.py [--size 4096] [--per-column 32] [--batch 256]
        [--isa default|all|avx512|avx2|portable]

Measures, in one process and interleaved (medians of repeated runs):
  * a training step (forward, gradients, SGD update) of SparseDense (compiled
    kernels, and TensorFlow's CSR ops: its GPU path), Dense, and a layer built
    on tf.sparse.sparse_dense_matmul;
  * inference of SparseDense, Dense and SciPy's CSR product (one thread).
With ``--isa all``, SparseDense runs once per kernel variant the CPU
supports (AVX-512, AVX2, portable), each traced on its variant, all in the
same interleaved rounds. Prints the CPU, times, ratios and the targets per
variant.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.ops import SparsityPattern, sparse_matmul  # noqa: E402
from timing import add_isa_argument, describe_machine, interleaved_medians, isas_to_run, traced_on  # noqa: E402


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


def train_step_fn(layer, x, target):
    optimizer = keras.optimizers.SGD(1e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(layer(x) - target))
        grads = tape.gradient(loss, layer.trainable_weights)
        optimizer.apply_gradients(zip(grads, layer.trainable_weights))
        return loss

    return lambda: step().numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    add_isa_argument(parser)
    args = parser.parse_args()
    isas = isas_to_run(args.isa)
    n, batch = args.size, args.batch
    pattern = SparsityPattern.random((n, n), args.per_column / n, seed=0)
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(pattern.nnz) / np.sqrt(args.per_column)).astype(np.float32)
    matrix = pattern.to_scipy(values)
    x = tf.constant(rng.standard_normal((batch, n)).astype(np.float32))
    target = tf.constant(rng.standard_normal((batch, n)).astype(np.float32))

    sparse = SparseDense(n, pattern=matrix)
    tf_ops = TensorFlowOpsSparseDense(n, pattern=matrix)
    dense = keras.layers.Dense(n, kernel_initializer=keras.initializers.Constant(matrix.toarray()))
    tf_sparse = TFSparseMatmulDense(pattern, values)
    for layer in (sparse, tf_ops, dense, tf_sparse):
        layer(x[:1])
    print(f"kernel {n}x{n}, {args.per_column} nonzeros per column "
          f"(nnz={pattern.nnz}, density={pattern.density:.4%}), batch {batch}, float32; "
          f"{os.cpu_count()} CPUs; medians of {args.repeats} interleaved runs")
    print(describe_machine(isas) + "\n")
    names = {isa: f"SparseDense [{isa or 'TF fallback'}]" for isa in isas}

    train = interleaved_medians({
        **{names[isa]: traced_on(isa, train_step_fn(sparse, x, target)) for isa in isas},
        "SparseDense on TF CSR ops (GPU path)": train_step_fn(tf_ops, x, target),
        "Dense": train_step_fn(dense, x, target),
        "tf.sparse.sparse_dense_matmul layer": train_step_fn(tf_sparse, x, target),
    }, repeats=args.repeats)

    x_numpy = x.numpy()
    predict = {
        **{names[isa]: traced_on(isa, tf.function(lambda: sparse(x))) for isa in isas},
        "SparseDense on TF CSR ops (GPU path)": tf.function(lambda: tf_ops(x)),
        "Dense": tf.function(lambda: dense(x)),
    }
    # Every candidate ends with its product as a NumPy array, as SciPy's
    # does: np.asarray views a CPU tensor's buffer (Tensor.numpy() would add a
    # copy of the output to the TensorFlow candidates only).
    infer = interleaved_medians({
        **{names[isa]: (lambda name=names[isa]: np.asarray(predict[name]())) for isa in isas},
        "SparseDense on TF CSR ops (GPU path)":
            lambda: np.asarray(predict["SparseDense on TF CSR ops (GPU path)"]()),
        "Dense": lambda: np.asarray(predict["Dense"]()),
        "SciPy CSR (1 thread)": lambda: x_numpy @ matrix,
    }, repeats=args.repeats)

    def table(title, results, reference):
        print(f"{title:<40} {'median ms':>10} {'/ ' + reference:>32}")
        for name, seconds in results.items():
            print(f"{name:<40} {seconds * 1e3:>10.2f} {seconds / results[reference]:>31.1f}x")
        print()

    table("training step", train, names[isas[0]])
    table("inference", infer, names[isas[0]])
    for isa in isas:
        ours_train, ours_infer = train[names[isa]], infer[names[isa]]
        targets = [
            ("train step >= 6x faster than Dense", train["Dense"] / ours_train, 6),
            ("train step >= 3x faster than tf.sparse layer",
             train["tf.sparse.sparse_dense_matmul layer"] / ours_train, 3),
            ("inference >= 10x faster than Dense", infer["Dense"] / ours_infer, 10),
            ("inference not slower than SciPy CSR", infer["SciPy CSR (1 thread)"] / ours_infer, 1),
        ]
        for name, ratio, goal in targets:
            print(f"{'PASS' if ratio >= goal else 'FAIL'}  [{isa or 'TF fallback'}] {name}: {ratio:.1f}x")


if __name__ == "__main__":
    main()
