"""Where a sparse kernel stops paying: SparseDense vs Dense forward time by density.

``tfsparse.fssl.compact`` turns a compacted SparseDense into a Dense layer when
its remaining kernel's density is at least ``dense_threshold``; this script
measures the crossover that sets its default. Both layers run side by side in
one process on the same inputs, timed in interleaved rounds; the script prints
medians of repeated runs and their ratio for each density, and the
interpolated crossover per shape.

Usage:
    python benchmarks/fssl_crossover.py [--batch 256] [--repeats 30]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse.layers import SparseDense  # noqa: E402

DENSITIES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6)
SHAPES = ((256, 256), (512, 512), (1024, 1024))


def interleaved_medians(functions, x, repeats):
    """Median seconds of each function on ``x``, timed in interleaved rounds."""
    for function in functions.values():
        function(x)  # trace and warm up
        function(x)
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function(x).numpy()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}


def forward(layer):
    return tf.function(lambda x: layer(x))


def crossover(densities, ratios):
    """The density where sparse/dense time crosses 1, linearly interpolated."""
    for (d0, r0), (d1, r1) in zip(zip(densities, ratios), zip(densities[1:], ratios[1:])):
        if r0 < 1 <= r1:
            return d0 + (1 - r0) * (d1 - d0) / (r1 - r0)
    return None if ratios[0] >= 1 else float("inf")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for n_in, n_out in SHAPES:
        x = tf.constant(rng.standard_normal((args.batch, n_in)).astype(np.float32))
        dense = keras.layers.Dense(n_out)
        dense.build((None, n_in))
        functions = {"dense": forward(dense)}
        for density in DENSITIES:
            sparse = SparseDense(n_out, density=density, seed=1)
            sparse.build((None, n_in))
            functions[density] = forward(sparse)
        times = interleaved_medians(functions, x, args.repeats)
        print(f"shape {n_in}x{n_out}, batch {args.batch}: Dense {times['dense'] * 1e3:.3f} ms")
        ratios = [times[density] / times["dense"] for density in DENSITIES]
        for density, ratio in zip(DENSITIES, ratios):
            print(f"  density {density:5.2f}: SparseDense {times[density] * 1e3:8.3f} ms, "
                  f"sparse/dense time {ratio:6.2f}")
        point = crossover(DENSITIES, ratios)
        print(f"  crossover density: {point if point is None else round(point, 3)}")


if __name__ == "__main__":
    main()
