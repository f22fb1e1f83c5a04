"""SparseConv2D against Conv2D (TensorFlow's oneDNN path), side by side.

    python benchmarks/sparse_conv_speed.py [--isa all|avx512|avx2|portable] [--repeats 10]
                                           [--conv2d-isa matched|native]

Issue 15's case: one 3x3 layer, 64 -> 64 channels, 32 x 32 input, stride 1,
"same", batch 32, float32, at 80/90/95/98% sparsity, and the same for a strided
(stride 2) and a 1x1 layer. For each: inference and a training step (forward,
the input and weight gradients, SGD update) of SparseConv2D (compiled kernels
in the variant asked) and of Conv2D with the same masked kernel, interleaved
in one process (medians). SparseConv2D on TensorFlow's CSR ops (the GPU /
kernels-off path) is timed in a round of its own against Conv2D: it sweeps
over 100 MB per call (an im2col-sized window per tap), and whichever layer
ran after it took longer for it (at 95%: Conv2D 0.7 ms, SparseConv2D 1.0 ms
more than after each other), a neighbour neither meets in a network. Prints
the CPU, the kernel variant, times and ratios, the issue's targets, the
ratios SparseProp reported for the same case, and the crossover sparsity.

Conv2D's instruction set follows the variant (``--conv2d-isa matched``, the
default): each variant runs in a process of its own with oneDNN capped by
``ONEDNN_MAX_CPU_ISA`` at what a CPU whose widest tfsparse variant is that
one has (avx512: AVX512_CORE; avx2: AVX2; portable: AVX, as TensorFlow's
wheels need AVX), so a forced variant meets the Conv2D its CPUs run.
``--conv2d-isa native`` times every variant against oneDNN's own choice on
this CPU, in one process.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
from tfsparse.layers import SparseConv2D  # noqa: E402
from tfsparse.ops import kernels  # noqa: E402
from tfsparse.ops.conv import sparse_conv2d  # noqa: E402
from sparse_dense_speed import train_step_fn  # noqa: E402
from timing import (add_isa_argument, describe_machine, interleaved_medians,  # noqa: E402
                    isas_to_run)

# SparseProp's SparseConv2d (PyTorch, CPU) at 95% sparsity, as multiples of
# TensorFlow's Conv2D: inference, training step (issue 15, AMD EPYC Zen 3).
SPARSEPROP = (2.0, 2.0)
# The geometry classes sparsify's default rule tells apart
# (tfsparse/layers/_conversion.py, CONV2D_CROSSOVER_DENSITY): (kernel size, stride).
GEOMETRIES = {"3x3 s1": (3, 1), "3x3 s2": (3, 2), "1x1 s1": (1, 1)}
SPARSITIES = (0.80, 0.90, 0.95, 0.98)
MODES = ("inference", "training step")  # the order of run_case's two ratios
# oneDNN's instruction-set cap (ONEDNN_MAX_CPU_ISA) for Conv2D on a CPU whose
# widest tfsparse variant is the key. TensorFlow's wheels are compiled for AVX,
# so a CPU that runs them without AVX2 + FMA (portable) still has AVX.
MATCHED_ONEDNN_ISA = {"avx512": "AVX512_CORE", "avx2": "AVX2", "portable": "AVX"}
TF_OPS = "SparseConv2D on TF ops"
CASES = [(f"{geometry} {sparsity:.0%}", kernel, stride, sparsity)  # (name, size, stride, sparsity)
         for geometry, (kernel, stride) in GEOMETRIES.items() for sparsity in SPARSITIES]


class TensorFlowOpsSparseConv2D(SparseConv2D):
    """SparseConv2D on TensorFlow's CSR ops (its GPU and kernels-off path)."""

    def call(self, inputs):
        return sparse_conv2d(inputs, self.values, self._pattern(), self.kernel_size,
                             self.strides, self.padding, self.dilation_rate,
                             use_kernel=False, bias=self.bias)


def infer_fn(layer, x, jit_compile=False):
    predict = tf.function(lambda: layer(x), jit_compile=jit_compile)
    return lambda: np.asarray(predict())


def layers_for(kernel_size, stride, sparsity, channels, rng):
    shape = (kernel_size, kernel_size, channels, channels)
    kernel = rng.standard_normal(shape).astype(np.float32) * 0.05
    kernel *= rng.random(shape) >= sparsity
    settings = dict(strides=stride, padding="same")
    return {
        "SparseConv2D": SparseConv2D(channels, kernel_size, pattern=kernel, **settings),
        TF_OPS: TensorFlowOpsSparseConv2D(
            channels, kernel_size, pattern=kernel, **settings),
        "Conv2D": keras.layers.Conv2D(
            channels, kernel_size, kernel_initializer=keras.initializers.Constant(kernel),
            **settings),
    }


def run_case(name, kernel_size, stride, sparsity, args, rng):
    x = tf.constant(rng.standard_normal((args.batch, args.size, args.size, args.channels)),
                    tf.float32)
    layers = layers_for(kernel_size, stride, sparsity, args.channels, rng)
    target = tf.zeros_like(layers["Conv2D"](x))
    for layer in layers.values():
        layer(x[:1])
    ratios = []
    for title, make in (("inference", lambda l: infer_fn(l, x)),
                        ("training step", lambda l: train_step_fn(l, x, target))):
        fns = {n: make(l) for n, l in layers.items()}
        # Each round pairs one SparseConv2D path with Conv2D (module docstring).
        pair = interleaved_medians({n: fns[n] for n in ("SparseConv2D", "Conv2D")},
                                   repeats=args.repeats)
        slow = interleaved_medians({n: fns[n] for n in (TF_OPS, "Conv2D")},
                                   repeats=args.repeats)
        print(f"{name:<12} {title:<14} SparseConv2D {pair['SparseConv2D'] * 1e3:7.2f} ms  "
              f"Conv2D {pair['Conv2D'] * 1e3:7.2f} ms  "
              f"Conv2D/SparseConv2D {pair['Conv2D'] / pair['SparseConv2D']:5.2f}x  |  "
              f"{TF_OPS} {slow[TF_OPS] * 1e3:7.2f} ms, "
              f"Conv2D/TF ops {slow['Conv2D'] / slow[TF_OPS]:5.2f}x")
        ratios.append(pair["Conv2D"] / pair["SparseConv2D"])
    return tuple(ratios)


def crossovers(ratios):
    """{(geometry, mode): the lowest sparsity from which sparse is faster at every
    higher one measured, or None}."""
    found = {}
    for geometry in GEOMETRIES:
        for index, mode in enumerate(MODES):
            lowest = None
            for sparsity in reversed(SPARSITIES):  # from the sparsest down
                if ratios[f"{geometry} {sparsity:.0%}"][index] <= 1:
                    break
                lowest = sparsity
            found[geometry, mode] = lowest
    return found


def run_variant(args):
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(f"\nkernel variant: {kernels.isa()}; Conv2D: oneDNN "
          + (f"capped at {cap} (ONEDNN_MAX_CPU_ISA)" if cap else "on this CPU's own choice"))
    rng = np.random.default_rng(0)
    ratios = {case[0]: run_case(*case, args, rng) for case in CASES}
    infer, train = ratios["3x3 s1 95%"]
    for goal_name, ratio, goal in (("inference >= 3x Conv2D at 95%", infer, 3),
                                   ("training step >= 2x Conv2D at 95%", train, 2)):
        print(f"{'PASS' if ratio >= goal else 'FAIL'}  {goal_name}: {ratio:.2f}x")
    for goal_name, ratio, peer in (("inference", infer, SPARSEPROP[0]),
                                   ("training step", train, SPARSEPROP[1])):
        print(f"{'PASS' if ratio > peer else 'FAIL'}  {goal_name} at 95% beats SparseProp's "
              f"{peer:.1f}x Conv2D (issue 15, AMD EPYC Zen 3): {ratio:.2f}x")
    found = crossovers(ratios)
    for (geometry, mode), lowest in found.items():
        print(f"{geometry} {mode}: sparse faster from sparsity "
              + (f"{lowest:.0%}" if lowest is not None else "none of 80-98%"))
    return found


def run_variant_in_own_process(variant, args):
    """run_variant for ``variant`` in a child process whose oneDNN is capped at
    MATCHED_ONEDNN_ISA[variant] (the cap is read once per process)."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=MATCHED_ONEDNN_ISA[variant])
    with tempfile.TemporaryDirectory() as directory:
        found_path = os.path.join(directory, "found.json")
        command = [sys.executable, os.path.abspath(__file__), "--isa", variant,
                   "--conv2d-isa", "matched", "--found-json", found_path,
                   "--repeats", str(args.repeats), "--batch", str(args.batch),
                   "--size", str(args.size), "--channels", str(args.channels)]
        subprocess.run(command, env=env, check=True)
        with open(found_path) as file:
            rows = json.load(file)
    return {(geometry, mode): lowest for geometry, mode, lowest in rows}


def print_crossover_densities(found_by_variant):
    """The density below which sparse was faster in both modes on every variant run."""
    print(f"\ncrossover density per geometry, inference and training step on "
          f"{', '.join(found_by_variant)} (sparsify's default rule):")
    for geometry in GEOMETRIES:
        lowest = [found[geometry, mode] for found in found_by_variant.values()
                  for mode in MODES]
        if any(sparsity is None for sparsity in lowest):
            print(f"  {geometry}: none (sparse not faster at every sparsity up to "
                  f"{SPARSITIES[-1]:.0%} in some mode)")
        else:
            print(f"  {geometry}: {1 - max(lowest):.2f}")


def add_layer_arguments(parser):
    """``--repeats``, and the layer's ``--batch``, ``--size`` and ``--channels``."""
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--channels", type=int, default=64)


def compiled_variants_and_header(args, case):
    """The variants ``--isa`` asks for, after printing the run's header line.

    Exits when the compiled kernels are missing (both conv benchmarks time
    them). ``case``: the settings beyond the layer arguments, for the header
    (e.g. ``"3x3, "``).
    """
    variants = isas_to_run(args.isa)
    if variants == [None]:
        raise SystemExit("the compiled kernels are not available: build them with "
                         "`python -m tfsparse.ops.build`")
    print(f"{describe_machine(variants)}; {os.cpu_count()} CPUs; {case}batch {args.batch}, "
          f"{args.size}x{args.size}, {args.channels}->{args.channels} channels, 'same', "
          f"float32; medians of {args.repeats} interleaved runs", flush=True)
    return variants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_isa_argument(parser)
    parser.add_argument("--conv2d-isa", choices=("matched", "native"), default="matched",
                        help="Conv2D's oneDNN instruction set: capped at what a CPU of each "
                             "kernel variant has (each variant in its own process), or this "
                             "CPU's own for every variant")
    add_layer_arguments(parser)
    parser.add_argument("--found-json", help=argparse.SUPPRESS)  # a child's crossovers
    args = parser.parse_args()
    variants = compiled_variants_and_header(args, "")
    found_by_variant = {}
    for variant in variants:
        matched = MATCHED_ONEDNN_ISA[variant]
        if args.conv2d_isa == "matched" and os.environ.get("ONEDNN_MAX_CPU_ISA") != matched:
            found_by_variant[variant] = run_variant_in_own_process(variant, args)
            continue
        with kernels.use_isa(variant):
            found_by_variant[variant] = run_variant(args)
    if args.found_json:
        with open(args.found_json, "w") as file:
            json.dump([[geometry, mode, lowest] for (geometry, mode), lowest
                       in found_by_variant[variants[0]].items()], file)
        return
    print_crossover_densities(found_by_variant)


if __name__ == "__main__":
    main()
