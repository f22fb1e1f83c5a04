"""Peak memory of one RigL update of a huge SparseDense, above the layer's own.

    python benchmarks/dynamic_sparsity_memory.py [--size 65536] [--per-column 32]
        [--batch 32] [--block-elements 8388608]

Builds a ``size x size`` SparseDense with ``per-column`` nonzeros per unit
(65536 x 65536 with 32: 2.1 M nonzeros of 4.3 G positions) in a one-layer
model, trains one step with Adam (so its slots exist), then measures the
process's resident memory (Linux ``VmRSS``) before the update and its peak
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before) during one
RigL update: the blockwise dense gradient, the running top-k, the drop, the
new pattern, and the moved values and Adam slots. The dense gradient alone
would take ``size^2 * 4`` bytes (16 GiB here).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from dynamic_common import platform_line  # noqa: E402
from tfsparse._keras import keras  # noqa: E402
from tfsparse.dynamic import drop_and_grow  # noqa: E402
from tfsparse.dynamic import largest_gradient_keys  # noqa: E402
from tfsparse.dynamic import layer_gradients  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse._memory import reset_peak_rss, status_kib  # noqa: E402

MIB = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--block-elements", type=int, default=None)
    args = parser.parse_args()
    rss_start = status_kib("VmRSS")
    layer = SparseDense(args.size, density=args.per_column / args.size, seed=0)
    model = keras.Sequential([keras.Input((args.size,)), layer])
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.size)).astype(np.float32)
    y = rng.standard_normal((args.batch, args.size)).astype(np.float32)
    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)
    # The layer's own memory: values, bias, three int32 pattern arrays, Adam's
    # two slots; the batch (x, y, outputs) is the step's.
    layer_bytes = layer.nnz * (4 + 3 * 4 + 2 * 4) + args.size * 4 * 3
    rss_before = status_kib("VmRSS")
    reset_peak_rss()
    start = time.perf_counter()
    (inputs, output_gradients), = layer_gradients(model, [layer], x, y)

    def grow(taken, count):
        return largest_gradient_keys(inputs, output_gradients, taken, count,
                                     args.block_elements)

    moved = drop_and_grow(layer, 0.3, grow, optimizer=model.optimizer)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    print(platform_line())
    print(f"SparseDense {args.size} x {args.size}, {args.per_column} nonzeros per column "
          f"({layer.nnz:,} nonzeros), batch {args.batch}, Adam; one RigL update moving "
          f"30% ({moved:,} new positions) in {seconds:.1f} s")
    print(f"layer state (values, pattern, bias, Adam slots): {layer_bytes / MIB:.0f} MiB; "
          f"process RSS at start {rss_start / 1024:.0f} MiB, before the update "
          f"{rss_before / 1024:.0f} MiB")
    print(f"peak RSS during the update: {peak / 1024:.0f} MiB, i.e. "
          f"{(peak - rss_before) / 1024:.0f} MiB above the memory before it; a dense "
          f"gradient would be {args.size ** 2 * 4 / MIB:,.0f} MiB")


if __name__ == "__main__":
    main()
