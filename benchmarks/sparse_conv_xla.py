"""SparseConv2D compiled by XLA (jit_compile=True) against the same layer without XLA.

    python benchmarks/sparse_conv_xla.py [--isa all|avx512|avx2|portable] [--repeats 10]
                                         [--sparsity 0.95]

Under XLA each of SparseConv2D's ops is a custom call to the same compiled
kernel (tfsparse/ops/kernels/sparse_conv_xla.cc), so the two should take
about the same time; what XLA adds is its own fusion of the ops around them
(the loss, the update) and its call overhead. Issue 15's layer (3x3, 64 -> 64
channels, 32 x 32, "same", batch 32, float32): inference and a training step
(forward, input and weight gradients, SGD update), each as a ``tf.function``
with and without ``jit_compile``, interleaved in one process (medians), with
Conv2D (the same masked kernel) both ways beside them: without XLA it runs
oneDNN's convolution, under XLA XLA's own. Prints the CPU, the kernel
variant, the times and the ratios.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse.ops import kernels  # noqa: E402
from sparse_conv_speed import (TF_OPS, add_layer_arguments,  # noqa: E402
                               compiled_variants_and_header, infer_fn, layers_for)
from sparse_dense_speed import train_step_fn  # noqa: E402
from timing import add_isa_argument, interleaved_medians  # noqa: E402


def run_variant(args, rng):
    # The benchmark's layers, without its TensorFlow-ops SparseConv2D (which
    # XLA cannot compile).
    layers = {name: layer for name, layer in layers_for(3, 1, args.sparsity, args.channels,
                                                         rng).items() if name != TF_OPS}
    x = tf.constant(rng.standard_normal((args.batch, args.size, args.size, args.channels)),
                    tf.float32)
    target = tf.zeros_like(layers["Conv2D"](x))
    for title, make in (("inference", lambda l, jit: infer_fn(l, x, jit)),
                        ("training step", lambda l, jit: train_step_fn(l, x, target,
                                                                      jit_compile=jit))):
        fns = {(name, jit): make(layer, jit) for name, layer in layers.items()
               for jit in (False, True)}
        times = interleaved_medians(fns, repeats=args.repeats)
        for name in layers:
            plain, xla = times[name, False], times[name, True]
            print(f"  {title:<14} {name:<12} without XLA {plain * 1e3:7.2f} ms  "
                  f"XLA {xla * 1e3:7.2f} ms  without / XLA {plain / xla:5.2f}x")
        print(f"  {title:<14} Conv2D under XLA / SparseConv2D under XLA: "
              f"{times['Conv2D', True] / times['SparseConv2D', True]:5.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_isa_argument(parser)
    add_layer_arguments(parser)
    parser.add_argument("--sparsity", type=float, default=0.95)
    args = parser.parse_args()
    # Each variant traces its own functions of the same layers: not the
    # retracing in a loop that TensorFlow's warning is about.
    tf.get_logger().setLevel("ERROR")
    variants = compiled_variants_and_header(args, f"3x3, {args.sparsity:.0%} sparse, ")
    for variant in variants:
        print(f"\nkernel variant: {variant}")
        with kernels.use_isa(variant):
            run_variant(args, np.random.default_rng(0))


if __name__ == "__main__":
    main()
