"""Peak memory of a huge SparseDense against the size of its dense kernel.

    python benchmarks/sparse_dense_memory.py [--neurons 65536] [--per-column 32] [--batch 8]

Runs, in a fresh subprocess each (so peaks don't mix): Python + TensorFlow
alone, then creating the layer, then a forward and backward pass. Prints the
peak resident memory of each next to the dense kernel's size.
"""

import argparse
import os
import subprocess
import sys
import textwrap

_STAGES = {
    "TensorFlow imported": "",
    "layer created": "layer = SparseDense(n, density=k / n, seed=0); layer.build((None, n))",
    "forward + backward": textwrap.dedent(
        """
        layer = SparseDense(n, density=k / n, seed=0)
        x = tf.random.normal((batch, n))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) ** 2)
        tape.gradient(loss, layer.trainable_weights)
        """
    ),
}


def peak_bytes(code, n, k, batch):
    program = (
        "import tensorflow as tf\n"
        "from tfsparse.layers import SparseDense\n"
        f"n, k, batch = {n}, {k}, {batch}\n"
        f"{code}\n"
        # VmHWM, this process's own peak (not this script's: see _memory).
        "from tfsparse._memory import peak_rss_bytes\n"
        "print(peak_rss_bytes())\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", program], env=env, check=True,
                            capture_output=True, text=True)
    return int(result.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neurons", type=int, default=65536)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    n, k = args.neurons, args.per_column
    dense = n * n * 4
    print(f"SparseDense {n} x {n}, {k} nonzeros per column (nnz={n * k:,}), batch {args.batch}")
    print(f"dense float32 kernel would be {dense / 2**30:.2f} GiB\n")
    print(f"{'stage':<22} {'peak RSS GiB':>12} {'share of dense kernel':>22}")
    for name, code in _STAGES.items():
        peak = peak_bytes(code, n, k, args.batch)
        print(f"{name:<22} {peak / 2**30:>12.2f} {peak / dense:>21.1%}")


if __name__ == "__main__":
    main()
