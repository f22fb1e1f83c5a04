"""SparseDense against Dense, a tf.sparse layer and SciPy, side by side.

    python benchmarks/sparse_dense_speed.py [--size 4096] [--per-column 32]
        [--batch 256 [8 ...]] [--isa default|all|avx512|avx2|portable]

Measures, in one process and interleaved (medians of repeated runs), for
each batch size:
  * a training step (forward, the input and weight gradients, SGD update)
    of SparseDense (compiled kernels on each chosen variant, and
    TensorFlow's CSR ops: its GPU path),
    Dense, and a layer built on tf.sparse.sparse_dense_matmul, each a
    tf.function (as Keras's fit runs its steps);
  * inference of SparseDense, Dense and SciPy's CSR product (one thread), the
    Keras layers in the three forms a Keras user serves them: a tf.function
    taking the batch as its argument (as a Python server calls a model), a
    concrete function of any batch size (a loaded SavedModel's serving
    signature), and the layer called eagerly (``layer(x)``, as ``model(x)``
    runs it). Each form has its floor, the same call of something that
    computes next to nothing (a function returning x's first row; the eager
    layer returning x), which no candidate of that form can beat: at small
    batches the call, not the product, is most of the time. (A function
    returning its argument x itself measured 0.06 ms more as a tf.function
    and 0.28-0.34 ms more as a concrete function, at batch 8 and 256 here:
    not a floor of the others.) The tf.function and signature forms, their
    floors and SciPy are timed again in their steady state: each timed
    call the second of two back to back, without the cost of switching
    from the candidate before it.
Prints times, ratios, the issue's targets, and for every variant the roofline
bound of its kernels on this machine (benchmarks/roofline.py) with the
fraction of it SparseDense achieves: of the whole call, and of each of the
three kernels of a training step (forward SpMM, input-gradient SpMM, SDDMM)
alone, timed inside one graph without TensorFlow's per-call cost
(benchmarks/kernel_time.py), against both bounds: with the rows the kernels
read at random charged at the caches' stream rates (the tighter: the
targets' bound) and at the gather probe's rate (the rate of that access on
this CPU); with several batches, the curve of all of them at the end.
"""

import argparse
import contextlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.ops import kernels_available, sparse_matmul  # noqa: E402
from tfsparse.ops import kernels  # noqa: E402
import kernel_time  # noqa: E402
import roofline  # noqa: E402
from timing import check_layer_arguments, cpu_model, interleaved_medians, random_layer  # noqa: E402


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


def first_row(x):
    """``x[:1]``: the floors' function, which computes next to nothing."""
    return x[:1]


class ReturnsInputs(keras.layers.Layer):
    """The eager call floor: a Keras layer whose call returns its input."""

    def call(self, inputs):
        return inputs


class TensorFlowOpsSparseDense(SparseDense):
    """SparseDense on TensorFlow's own CSR ops (its GPU and export path)."""

    def call(self, inputs):
        outputs = sparse_matmul(inputs, self.values, self.pattern_tensors(), use_kernel=False)
        return tf.nn.bias_add(outputs, self.bias)


def train_step_fn(layer, x, target, variant=None, jit_compile=False):
    """One SGD step of ``layer`` as a zero-argument callable, traced under ``variant``.

    The step of a layer inside a network: the forward pass, the gradients of
    the loss with respect to the layer's input (what the layers below it
    need) and to its weights, and the update. The input gradient is returned
    from the function: a tf.function prunes what nothing uses, so with a
    constant input and no output it would never be computed.
    """
    optimizer = keras.optimizers.SGD(1e-3)

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_mean(tf.square(layer(x) - target))
        input_gradient, *grads = tape.gradient(loss, [x, *layer.trainable_weights])
        optimizer.apply_gradients(zip(grads, layer.trainable_weights))
        return loss, input_gradient

    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        step.get_concrete_function()
    return lambda: step()[0].numpy()


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


def serving_function(variant, fn, x):
    """``lambda: fn(x)`` as a server runs it: a tf.function taking the batch.

    Traced under ``variant`` (its ops keep the kernel variant). The batch is
    an argument, as in a serving loop, not a constant captured in the graph.
    """
    function = tf.function(fn)
    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        function(x)
    return lambda: function(x)


def signature_function(variant, fn, x):
    """``lambda: fn(x)`` as a loaded SavedModel's signature runs it.

    A concrete function of any batch size (``tf.TensorSpec([None, n])``),
    the form ``tf.saved_model.save`` stores as a serving signature, called
    with the batch. It skips the tf.function's Python dispatch (argument
    binding, trace-cache lookup), measured 0.2-0.3 ms per call here.
    """
    function = tf.function(fn)
    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        concrete = function.get_concrete_function(tf.TensorSpec([None, x.shape[1]], x.dtype))
    return lambda: concrete(x)


def eager_call(variant, layer, x):
    """``lambda: layer(x)``: the layer called eagerly, its ops on ``variant``.

    An eager call picks the kernel variant when it runs, so each call runs
    inside ``kernels.use_isa`` (a few microseconds, on every variant).
    """
    if variant is None:
        return lambda: layer(x)

    def call():
        with kernels.use_isa(variant):
            return layer(x)

    return call


def fastest_run(fn, repeats):
    """The fastest of ``repeats`` calls, in seconds: on a shared machine the
    run closest to what the hardware does, comparable with the roofline's
    probes, which keep their fastest runs too."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def kernel_bounds(sparse_names, pattern, batch, gathers=False):
    """The roofline bound of each kernel of a training step, per SparseDense variant.

    Measures each variant's rates once (``roofline.measure``). With
    ``gathers``, the bounds that charge the rows the kernels read at random
    at the gather probe's rate (``roofline.gather_seconds``) instead.

    Returns:
      dict name -> {"forward" | "input gradient" | "SDDMM": (bound seconds,
      binding resource)}; the input gradient is the SpMM ``dy @ W^T``.
    """
    n_in, units = pattern.shape
    rates_of, bounds = {}, {}
    for name, variant in sparse_names.items():
        if variant is None:
            continue
        if variant not in rates_of:
            rates_of[variant] = roofline.measure(variant, os.cpu_count())
        rates = rates_of[variant]
        by = {"gathers": roofline.gather_seconds(variant, os.cpu_count())} if gathers else {}
        bounds[name] = {
            "forward": roofline.spmm_bound(rates, variant, batch, n_in, units, pattern.nnz,
                                           **by),
            "input gradient": roofline.spmm_bound(rates, variant, batch, units, n_in,
                                                  pattern.nnz, **by),
            "SDDMM": roofline.sddmm_bound(rates, batch, n_in, units, pattern.nnz, **by),
        }
    return bounds


def rooflines(bounds_of, train, infer, fastest):
    """Each variant's call-level fractions of its bounds (``kernel_bounds``).

    Returns:
      dict name -> (inference bound seconds, its binding resource,
      training-step kernels' bound seconds).
    """
    bounds = {}
    print(f"roofline bounds (benchmarks/roofline.py, {os.cpu_count()} threads; "
          f"fraction = bound / median time, and bound / fastest run)")
    for name, by_kernel in bounds_of.items():
        forward, forward_by = by_kernel["forward"]
        step = sum(bound for bound, _ in by_kernel.values())
        bounds[name] = (forward, forward_by, step)
        print(f"  {name}: inference bound {forward * 1e3:.3f} ms ({forward_by}), "
              f"achieved {forward / infer[name]:.0%} (fastest run "
              f"{fastest[name] * 1e3:.3f} ms: {forward / fastest[name]:.0%}); training-step kernels bound "
              f"{step * 1e3:.2f} ms (SDDMM: {by_kernel['SDDMM'][1]}), "
              f"achieved {step / train[name]:.0%}")
    print()
    return bounds


def kernel_rooflines(bounds_of, gather_bounds_of, variant_of, pattern, values, batch,
                     repeats):
    """The three kernels of a training step, each alone (kernel_time.py), against their bounds.

    The forward SpMM with its bias, the input gradient ``dy @ W^T`` (the SpMM
    on W's nonzeros in row-major order, given permuted: the layer's gradient
    passes W's order to the op, which permutes the nonzeros before the SpMM;
    that pass is not SpMM work and is not in the fraction), and the SDDMM of
    the values gradient as the layer runs it (on ``x`` and ``dy``, which it
    transposes itself, in slices of the batch), on the layer's pattern and
    random ``x`` and ``dy``.
    The input gradient as the layer runs it, with the permutation, is timed
    and printed too.

    Args:
      bounds_of: ``kernel_bounds``'s result; gather_bounds_of: the same with
        ``gathers=True``; variant_of: dict name -> variant.

    Returns:
      dict name -> {kernel: (seconds, bound seconds, binding resource,
      gather bound seconds)}.
    """
    n_in, units = pattern.shape
    rng = np.random.default_rng(batch + 1)
    x = tf.constant(rng.standard_normal((batch, n_in)).astype(np.float32))
    dy = tf.constant(rng.standard_normal((batch, units)).astype(np.float32))
    order = pattern.row_major_order
    forward_inputs = (x, values, pattern.rows, pattern.cols, np.zeros(units, np.float32))
    # W^T's nonzeros sorted by its output index (W's row): W's row-major order.
    gradient_inputs = (dy, values[order], pattern.cols[order], pattern.rows[order])
    # As the layer's gradient runs it: on x and dy, transposed in the op.
    sddmm_inputs = (x, dy, pattern.rows, pattern.cols)
    in_order_inputs = (dy, values, pattern.rows, pattern.cols, order.astype(np.int32))
    ops = {}
    for name in bounds_of:
        variant = variant_of[name]
        ops[name, "forward"] = (
            lambda x, v, r, c, b: kernels.spmm(x, v, r, c, units, b), forward_inputs, variant)
        ops[name, "input gradient"] = (
            lambda dy, v, r, c: kernels.spmm(dy, v, r, c, n_in), gradient_inputs, variant)
        ops[name, "SDDMM"] = (
            lambda x, dy, r, c: kernels.sddmm(x, dy, r, c, batch_major=True), sddmm_inputs,
            variant)
        ops[name, "input gradient in order"] = (
            lambda dy, v, r, c, o: kernels.spmm(dy, v, c, r, n_in, order=o),
            in_order_inputs, variant)
    seconds = kernel_time.per_op_seconds(
        {f"{name} {kernel}": op for (name, kernel), op in ops.items()}, repeats)
    print("each kernel alone (benchmarks/kernel_time.py: run 11 times in one graph call, "
          "less once; without TensorFlow's per-call cost), fraction = bound / its time; "
          "then the bound with the rows read at random charged at the gather probe's rate")
    for name in bounds_of:
        in_order = seconds[f"{name} input gradient in order"]
        print(f"  {name} input gradient as the layer runs it (nonzeros permuted in the op): "
              f"{in_order * 1e3:.3f} ms, of which the permutation "
              f"{(in_order - seconds[f'{name} input gradient']) * 1e3:.3f} ms")
    found = {}
    for name, by_kernel in bounds_of.items():
        found[name] = {}
        for kernel, (bound, binding) in by_kernel.items():
            time_taken = seconds[f"{name} {kernel}"]
            gather_bound, gather_binding = gather_bounds_of[name][kernel]
            found[name][kernel] = (time_taken, bound, binding, gather_bound)
            print(f"  {name} {kernel:<15} {time_taken * 1e3:8.3f} ms, bound "
                  f"{bound * 1e3:.3f} ms ({binding}): {bound / time_taken:.0%}; gather bound "
                  f"{gather_bound * 1e3:.3f} ms ({gather_binding}): "
                  f"{gather_bound / time_taken:.0%}")
    print()
    return found


def run_batch(args, batch, matrix, pattern, values):
    """Times every candidate at ``batch`` rows; prints the tables and targets."""
    n = args.size
    rng = np.random.default_rng(batch)
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
          f"{os.cpu_count()} CPUs; medians of {args.repeats} interleaved runs; training "
          f"steps and inference as tf.functions taking the batch as argument\n")

    train_steps = {name: train_step_fn(layer, x, target, used)
                   for name, (layer, used) in sparse.items()}
    train = interleaved_medians({
        **train_steps,
        "SparseDense on TF CSR ops (GPU path)": train_step_fn(tf_ops, x, target),
        "Dense": train_step_fn(dense, x, target),
        "tf.sparse.sparse_dense_matmul layer": train_step_fn(tf_sparse, x, target),
    }, repeats=args.repeats)

    x_numpy = x.numpy()
    predict = {name: serving_function(used, layer, x) for name, (layer, used) in sparse.items()}
    predict["SparseDense on TF CSR ops (GPU path)"] = serving_function(None, tf_ops, x)
    predict["Dense"] = serving_function(None, dense, x)
    # What any layer called through a tf.function pays per call on this
    # machine, whatever it computes: the floor of the small batches.
    predict["function returning x[:1] (call floor)"] = serving_function(None, first_row, x)
    signature = {f"{name} signature": signature_function(used, layer, x)
                 for name, (layer, used) in sparse.items()}
    signature["Dense signature"] = signature_function(None, dense, x)
    signature["signature returning x[:1] (its call floor)"] = signature_function(
        None, first_row, x)
    eager = {f"{name} eager": eager_call(used, layer, x) for name, (layer, used) in sparse.items()}
    eager["Dense eager"] = eager_call(None, dense, x)
    eager["layer returning x (eager call floor)"] = eager_call(None, ReturnsInputs(), x)
    csr = matrix.tocsr()
    # Every candidate ends with its product as a NumPy array, as SciPy's
    # does: np.asarray views a CPU tensor's buffer (Tensor.numpy() would add a
    # copy of the output to the TensorFlow candidates only).
    infer = interleaved_medians({
        **{name: (lambda f=f: np.asarray(f()))
           for name, f in {**predict, **signature, **eager}.items()},
        "SciPy CSR (1 thread)": lambda: x_numpy @ csr,
    }, repeats=args.repeats)

    # The tf.function and signature calls again in their steady state: each
    # timed call the second of two back to back (as a server calling one
    # model makes them), so it does not pay for switching from the candidate
    # before it (evicted caches, pool threads to wake); SciPy's the same way.
    steady_forms = [*sparse, *(f"{name} signature" for name in sparse),
                    "function returning x[:1] (call floor)",
                    "signature returning x[:1] (its call floor)"]
    calls = {**predict, **signature}
    steady = interleaved_medians({
        **{name: (lambda f=calls[name]: np.asarray(f())) for name in steady_forms},
        "SciPy CSR (1 thread)": lambda: x_numpy @ csr,
    }, repeats=args.repeats, calls=2)

    for title, results in (("training step", train), ("inference", infer),
                           ("inference, steady state (second of 2 calls)", steady)):
        print_table(title, results, sparse)
    fastest = {name: fastest_run(lambda f=predict[name]: np.asarray(f()), args.repeats)
               for name in sparse}
    used_by_name = {name: used for name, (_, used) in sparse.items()}
    bounds_of = kernel_bounds(used_by_name, pattern, batch)
    bounds = rooflines(bounds_of, train, infer, fastest)
    alone = kernel_rooflines(bounds_of, kernel_bounds(used_by_name, pattern, batch, gathers=True),
                             used_by_name, pattern, values, batch, args.repeats)
    for name in sparse:
        print_targets(name, train, infer, batch, bounds.get(name), alone.get(name), steady)
    print()
    return train, infer, fastest, bounds, alone


def print_curve(curve):
    """Per batch and variant: inference and its fraction of the bound, ratios."""
    print("curve: inference as a tf.function, median ms (fraction of the roofline bound: "
          "of the median, of the fastest run), x SciPy CSR, x Dense; "
          "likewise as a SavedModel signature (concrete "
          "function) and called eagerly; training step median ms")
    for batch, (train, infer, fastest, bounds, alone) in curve.items():
        for name, (forward, forward_by, _) in bounds.items():
            print(f"  batch {batch:>5} {name:<24} {infer[name] * 1e3:8.3f} ms "
                  f"({forward / infer[name]:4.0%}, {forward / fastest[name]:4.0%} of "
                  f"{forward * 1e3:.3f} ms, {forward_by}), "
                  f"{infer['SciPy CSR (1 thread)'] / infer[name]:5.2f}x SciPy, "
                  f"{infer['Dense'] / infer[name]:6.2f}x Dense; signature "
                  f"{infer[name + ' signature'] * 1e3:8.3f} ms, "
                  f"{infer['SciPy CSR (1 thread)'] / infer[name + ' signature']:5.2f}x SciPy; eager "
                  f"{infer[name + ' eager'] * 1e3:8.3f} ms, "
                  f"{infer['SciPy CSR (1 thread)'] / infer[name + ' eager']:5.2f}x SciPy; "
                  f"training step {train[name] * 1e3:8.3f} ms; alone (of bound, of gather "
                  f"bound): "
                  + ", ".join(f"{kernel} {taken * 1e3:.3f} ms ({bound / taken:.0%}, "
                              f"{gathered / taken:.0%})"
                              for kernel, (taken, bound, _, gathered) in alone[name].items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[256],
                        help="batch size(s); several print the curve at the end")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--isa", default="default",
                        choices=("default", "all", *kernels.ISAS),
                        help="kernel variant(s) of SparseDense; 'all' runs every one "
                             "the CPU supports side by side")
    args = parser.parse_args()
    check_layer_arguments(parser, args)
    n = args.size
    pattern, values = random_layer(n, args.per_column, np.random.default_rng(0))
    matrix = pattern.to_scipy(values)
    # The machine's rates (roofline.measure keeps them) before TensorFlow
    # has run anything. Measured after the timings, the first variant's L2
    # rate came out half the usual in 2 of 6 runs here (its bound 0.86 ms
    # instead of 0.42-0.45); measured first, in none of 6.
    measured = {v: v for v in (variant or kernels.isa() for variant in chosen_variants(args.isa))
                if v is not None}
    for variant in measured:
        roofline.measure(variant, os.cpu_count())
    for batch in args.batch:  # the gather probes (roofline.gather_rate keeps them) too
        kernel_bounds(measured, pattern, batch, gathers=True)
    curve = {batch: run_batch(args, batch, matrix, pattern, values) for batch in args.batch}
    if len(curve) > 1:
        print_curve(curve)


def print_table(title, results, sparse):
    """Medians and how much faster each SparseDense variant is than each."""
    header = " ".join(f"{name.split()[-1] + ' faster by':>22}" for name in sparse)
    print(f"{title:<40} {'median ms':>10} {header}")
    for name, seconds in results.items():
        ratios = " ".join(f"{seconds / results[ref]:>21.2f}x" for ref in sparse)
        print(f"{name:<40} {seconds * 1e3:>10.3f} {ratios}")
    print()


def print_targets(name, train, infer, batch, bound, alone=None, steady=None):
    """The issue's targets; those of batch 256 for every batch of 256 or more.

    ``alone``: {kernel: (seconds, bound seconds, binding, gather bound seconds)}
    of kernel_rooflines. The targets are on the stream bounds (the tighter).
    ``steady``: the inference medians in their steady state (second of two
    calls back to back); its targets are printed apart, marked so.
    """
    scipy = infer["SciPy CSR (1 thread)"] / infer[name]
    targets = [
        ("train step >= 6x faster than Dense", train["Dense"] / train[name], 6),
        ("train step >= 3x faster than tf.sparse layer",
         train["tf.sparse.sparse_dense_matmul layer"] / train[name], 3),
        ("inference >= 10x faster than Dense", infer["Dense"] / infer[name], 10),
        ("inference not slower than SciPy CSR", scipy, 1),
        ("signature inference not slower than SciPy CSR",
         infer["SciPy CSR (1 thread)"] / infer[f"{name} signature"], 1),
        ("eager inference not slower than SciPy CSR",
         infer["SciPy CSR (1 thread)"] / infer[f"{name} eager"], 1),
    ]
    if steady is not None:
        for form, key in (("", name), ("signature ", f"{name} signature")):
            targets.append((f"{form}inference not slower than SciPy CSR (steady state)",
                            steady["SciPy CSR (1 thread)"] / steady[key], 1))
    if batch >= 256:
        targets.append(("inference >= 7x faster than SciPy CSR", scipy, 7))
        if steady is not None:
            targets.append(("inference >= 7x faster than SciPy CSR (steady state)",
                            steady["SciPy CSR (1 thread)"] / steady[name], 7))
        if bound is not None:
            targets.append(("inference (the whole call) >= 40% of its roofline bound",
                            bound[0] / infer[name], 0.4))
        for kernel, (taken, kernel_bound, _, _) in (alone or {}).items():
            targets.append((f"{kernel} kernel alone >= 40% of its roofline bound",
                            kernel_bound / taken, 0.4))
    for target, ratio, goal in targets:
        print(f"{'PASS' if ratio >= goal else 'FAIL'}  {name}: {target}: {ratio:.2f}"
              f"{'' if goal < 1 else 'x'}")


if __name__ == "__main__":
    main()
