"""GatherInputs on the SpMM kernel vs tf.gather along the last axis, side by side.

``tfsparse.fssl.compact`` puts a ``GatherInputs`` layer in front of a first
``Dense`` layer that lost inputs. On CPU it selects the kept columns with the
compiled SpMM kernel (a 0/1 kernel with one nonzero per column);
``tf.gather(x, indices, axis=-1)`` copies one float at a time. Each call runs
``--calls`` times inside one ``tf.function`` (so the Python call overhead is
shared out), on a fresh input each time; a plain slice of the same width is
the baseline that selects nothing. Defaults are the MNIST compaction of
``benchmarks/fssl_mnist.py``: 402 of 784 inputs, batch 256.

Usage:
    python benchmarks/fssl_gather.py [--batch 256] [--inputs 784] [--kept 402]
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse import fssl  # noqa: E402
from tfsparse.ops import kernels_available  # noqa: E402
from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)


def repeated(select, x, width, calls):
    """A callable running ``select`` on ``calls`` shifted copies of ``x`` in one tf.function."""
    @tf.function
    def run(inputs):
        total = tf.zeros((inputs.shape[0], width), inputs.dtype)
        for i in tf.range(calls):
            total += select(inputs + tf.cast(i, inputs.dtype))
        return tf.reduce_sum(total)

    return lambda: run(x).numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--inputs", type=int, default=784)
    parser.add_argument("--kept", type=int, default=402)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not kernels_available():
        raise SystemExit("the compiled kernels are not built: python -m tfsparse.ops.build")
    rng = np.random.default_rng(args.seed)
    kept = np.sort(rng.choice(args.inputs, args.kept, replace=False))
    x = tf.constant(rng.standard_normal((args.batch, args.inputs)).astype(np.float32))
    layer = fssl.GatherInputs(kept.tolist())
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy()[:, kept])
    candidates = {
        "GatherInputs (SpMM kernel)": repeated(layer, x, args.kept, args.calls),
        "tf.gather(x, indices, axis=-1)": repeated(
            lambda t: tf.gather(t, kept, axis=-1), x, args.kept, args.calls),
        "slice x[:, :kept] (selects nothing)": repeated(
            lambda t: t[:, :args.kept], x, args.kept, args.calls),
    }
    print(f"selecting {args.kept} of {args.inputs} inputs, batch {args.batch}; "
          "microseconds per call, baseline subtracted")
    for round_ in range(args.rounds):
        times = interleaved_medians(candidates, args.repeats, seed=round_)
        base = times["slice x[:, :kept] (selects nothing)"]
        ours = times["GatherInputs (SpMM kernel)"] - base
        gather = times["tf.gather(x, indices, axis=-1)"] - base
        print(f"round {round_ + 1}: GatherInputs {1e6 * ours / args.calls:.0f} us, "
              f"tf.gather {1e6 * gather / args.calls:.0f} us, ratio {gather / ours:.1f}x")


if __name__ == "__main__":
    main()
