"""A kernel op's own time, without TensorFlow's cost of calling a function.

    python benchmarks/kernel_time.py [--size 4096] [--per-column 32]
        [--batch 8 256] [--isa default|all|avx512|avx2|portable]
        [--iterations 1000] [--repeats 9]

As a script: SparseDense's forward op (``kernels.spmm`` with its pattern and
bias, as the layer runs it: the per-call checks of the pattern included) on
a random layer, each variant's loop interleaved with the others', ms per
op. With ``PYTHONPATH=<another checkout>`` it times that checkout's tfsparse
(build its kernels there first): an A/B of two revisions on one machine.

Calling a ``tf.function`` costs a fixed time whatever it computes (on this
project's 2-core VMs 0.6-1.2 ms: dispatch in Python, and a wait for an
inter-op thread to finish the call), which at batch 256 is as long as the
SpMM itself. A kernel's fraction of its roofline bound is a property of the
kernel, so here each op runs ``iterations`` times in sequence inside one
graph call (a ``tf.while_loop`` with ``parallel_iterations=1``; the op's
inputs travel through the loop, so nothing is hoisted out of it or shared
between iterations), and once inside the same loop in another function.
The difference of the two medians over ``iterations - 1`` is the op's time.
The loop's own bookkeeping per iteration stays in: the figure can only be a
little high.

Example:
  >>> import tensorflow as tf
  >>> seconds = per_op_seconds({"add": (tf.add, (tf.ones(4), tf.ones(4)), None)},
  ...                          repeats=3, iterations=3)
  >>> list(seconds)
  ['add']
"""

import argparse
import contextlib

import numpy as np
import tensorflow as tf

from timing import interleaved_medians


def looped(op, inputs, iterations, variant=None):
    """A zero-argument callable running ``op(*inputs)`` ``iterations`` times in one call.

    Args:
      op: a function of tensors returning one tensor.
      inputs: the op's input tensors.
      iterations: how many times the op runs, one after the other (>= 1).
      variant: the tfsparse kernel variant the op is traced under, or None.
    """
    from tfsparse.ops import kernels

    inputs = tuple(tf.convert_to_tensor(t) for t in inputs)

    @tf.function
    def run(*inputs):
        def body(i, inputs, out):
            return i + 1, inputs, op(*inputs)

        _, _, out = tf.while_loop(lambda i, inputs, out: i < iterations - 1, body,
                                  (tf.constant(0), inputs, op(*inputs)),
                                  parallel_iterations=1)
        return out

    with kernels.use_isa(variant) if variant else contextlib.nullcontext():
        run.get_concrete_function(*inputs)
    return lambda: np.asarray(run(*inputs))


def per_op_seconds(ops, repeats, iterations=11):
    """Each op's own time in seconds, the loops of all of them interleaved.

    Args:
      ops: dict name -> (op, inputs, variant), as ``looped`` takes them.
      repeats: timed calls of each loop (medians).
      iterations: the long loop's length; the short loop runs the op once.
    """
    loops = {}
    for name, (op, inputs, variant) in ops.items():
        loops[f"{name} x1"] = looped(op, inputs, 1, variant)
        loops[f"{name} x{iterations}"] = looped(op, inputs, iterations, variant)
    medians = interleaved_medians(loops, repeats=repeats)
    seconds = {name: (medians[f"{name} x{iterations}"] - medians[f"{name} x1"]) / (iterations - 1)
               for name in ops}
    unresolved = [name for name, taken in seconds.items() if not taken > 0]
    if unresolved:  # a negative "time" (it was printed as one) is noise, not a figure
        raise RuntimeError(
            f"The loop of {iterations} calls took no longer than one call for "
            f"{', '.join(unresolved)}: the op is below the timer's resolution here; give "
            "more iterations or a larger case")
    return seconds


def main():
    from timing import add_isa_argument, check_layer_arguments  # noqa: PLC0415
    from timing import describe_machine, isas_to_run  # noqa: PLC0415
    from timing import random_layer  # noqa: PLC0415
    from tfsparse.ops import kernels  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="SparseDense's forward op alone, per variant")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 256])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    add_isa_argument(parser)
    args = parser.parse_args()
    if args.iterations < 2:
        parser.error(f"--iterations must be at least 2, received {args.iterations}")
    check_layer_arguments(parser, args)
    variants = isas_to_run(args.isa)
    if variants == [None]:
        raise SystemExit("kernel_time.py times the compiled kernels, which are not built")
    n = args.size
    rng = np.random.default_rng(0)
    pattern, values = random_layer(n, args.per_column, rng)
    bias = rng.standard_normal(n).astype(np.float32)
    print(f"{n}x{n}, {args.per_column} nonzeros per column; {describe_machine(variants)}; "
          f"tfsparse from {kernels.__file__}; loops of {args.iterations}, medians of "
          f"{args.repeats}")
    for batch in args.batch:
        x = rng.standard_normal((batch, n)).astype(np.float32)
        ops = {variant: (lambda x, v, r, c, b: kernels.spmm(x, v, r, c, n, b),
                         (x, values, pattern.rows, pattern.cols, bias), variant)
               for variant in variants}
        seconds = per_op_seconds(ops, args.repeats, args.iterations)
        print(f"batch {batch:>5}: " + ", ".join(f"{v} {s * 1e3:.4f} ms"
                                               for v, s in seconds.items()), flush=True)


if __name__ == "__main__":
    main()
