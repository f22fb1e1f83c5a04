"""One inference call, warm and after the machine did something else.

    python benchmarks/call_warmth.py [--size 4096] [--per-column 32]
        [--batch 8 256] [--isa default|all|avx512|avx2|portable] [--calls 60]
        [--intra-op-threads N]

The side-by-side benchmarks (sparse_dense_speed.py, peers.py) interleave
their candidates, so each call follows another candidate's work. This
times the same calls under four conditions, each a run of ``--calls``
calls (medians, Python's garbage collector off):
  * back to back;
  * each after 5 ms of Python busy on the calling thread (one core busy,
    the other idle: as when SciPy's single-threaded product runs between
    two calls);
  * each after a 5 ms sleep (every core idle);
  * each after reading a 64 MiB array (the caches flushed).
The candidates: SparseDense's inference as a SavedModel signature (a
concrete function of any batch) on each chosen kernel variant, the same
signature's floor (returning ``x[:1]``), and SciPy's CSR product. It also
times how late a thread blocked on an event starts after being signalled,
when the signal follows 50 us or 5 ms of busy Python (the wake of an idle
core). Prints medians in ms (us for the wake). ``--intra-op-threads 1``
runs the ops on one thread (TensorFlow's intra-op pool of one): the time a
call would take if the second core never helped.
"""

import argparse
import gc
import os
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from sparse_dense_speed import first_row, signature_function, sparse_dense_on  # noqa: E402
from timing import add_isa_argument, describe_machine, isas_to_run, random_layer  # noqa: E402

GAP_SECONDS = 5e-3


def busy(seconds=GAP_SECONDS):
    """Python busy on the calling thread for ``seconds``."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def conditions():
    """{name: what runs before each call, or None}."""
    flush_array = np.ones(64 << 18, np.float32)  # 64 MiB
    return {
        "back to back": None,
        "after 5 ms busy": busy,
        "after 5 ms sleep": lambda: time.sleep(GAP_SECONDS),
        "after reading 64 MiB": flush_array.sum,
    }


def median_call(fn, before, calls, warmup=5):
    """Median seconds of ``fn()`` over ``calls`` calls, each after ``before()``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def wake_delays(gaps=(50e-6, GAP_SECONDS), signals=100):
    """{gap seconds: median seconds from set() to the waiting thread running}."""
    signal, answered, woke_at = threading.Event(), threading.Event(), [0.0]

    def waiter():
        while True:
            signal.wait()
            woke_at[0] = time.perf_counter()
            signal.clear()
            answered.set()

    threading.Thread(target=waiter, daemon=True).start()
    delays = {}
    for gap in gaps:
        samples = []
        for _ in range(signals):
            busy(gap)
            sent = time.perf_counter()
            signal.set()
            answered.wait()
            answered.clear()
            samples.append(woke_at[0] - sent)
        delays[gap] = float(np.median(samples))
    return delays


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-column", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 256])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow's intra-op pool size; 0 (default) leaves its choice")
    add_isa_argument(parser)
    args = parser.parse_args()
    if args.intra_op_threads < 0:
        parser.error(f"--intra-op-threads must be 0 or more, received {args.intra_op_threads}")
    import tensorflow as tf  # noqa: PLC0415 (after the environment is set)

    # Before any op runs: the pool is made once, at TensorFlow's first use.
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

    variants = isas_to_run(args.isa)
    n = args.size
    rng = np.random.default_rng(0)
    pattern, values = random_layer(n, args.per_column, rng)
    matrix = pattern.to_scipy(values).tocsr()
    threads = args.intra_op_threads or "TensorFlow's default"
    print(f"{n}x{n}, {args.per_column} nonzeros per column; {describe_machine(variants)}; "
          f"intra-op threads: {threads}; medians of {args.calls} calls, garbage collector "
          f"off\n")
    before = conditions()
    print(f"{'batch':>5} {'candidate':<38} " + " ".join(f"{c:>21}" for c in before))
    for batch in args.batch:
        x_numpy = rng.standard_normal((batch, n)).astype(np.float32)
        x = tf.constant(x_numpy)
        candidates = {}
        for variant in variants:
            layer, used = sparse_dense_on(variant, n, matrix, x)
            candidates[f"SparseDense [{used or 'TF fallback'}] signature"] = signature_function(
                used, layer, x)
        candidates["signature returning x[:1] (floor)"] = signature_function(None, first_row, x)
        candidates["SciPy CSR (1 thread)"] = lambda: x_numpy @ matrix
        gc.collect()
        gc.disable()
        try:
            for name, fn in candidates.items():
                call = (lambda fn=fn: np.asarray(fn()))
                medians = [median_call(call, b, args.calls) for b in before.values()]
                print(f"{batch:>5} {name:<38} " + " ".join(f"{m * 1e3:>18.3f} ms" for m in medians),
                      flush=True)
        finally:
            gc.enable()
    delays = wake_delays()
    print("\na thread woken after the signaller was busy: "
          + ", ".join(f"{gap * 1e6:.0f} us busy: {delay * 1e6:.1f} us late"
                      for gap, delay in delays.items()))


if __name__ == "__main__":
    main()
