"""Side-by-side timing: candidates run interleaved, medians compared."""

import gc
import time

import numpy as np


def interleaved_medians(candidates, repeats=30, warmup=3, seed=0):
    """Times each zero-argument callable ``repeats`` times, round-robin.

    Interleaving exposes every candidate to the same background load, so the
    ratios of the medians are meaningful on a shared, noisy machine. The
    order within each round is shuffled (seeded): a call pays for what the
    call before it left behind (evicted caches, memory to fault back in), so
    a fixed order would charge one candidate for its neighbour every time.
    As ``timeit`` does, Python's garbage collector is off while timing: a
    collection pass would land on whichever call happened to trigger it.

    Returns:
      dict name -> median seconds.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    names = list(candidates)
    order = np.random.default_rng(seed)
    samples = {name: [] for name in names}
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for index in order.permutation(len(names)):
                name = names[index]
                start = time.perf_counter()
                candidates[name]()
                samples[name].append(time.perf_counter() - start)
    finally:
        if was_enabled:
            gc.enable()
    return {name: float(np.median(times)) for name, times in samples.items()}


def cpu_model():
    """The CPU's model name as lscpu prints it (from /proc/cpuinfo), or the platform's."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def add_isa_argument(parser):
    """``--isa default|all|avx512|avx2|portable``: which kernel variants to time."""
    parser.add_argument(
        "--isa", default="default",
        help="kernel variant(s) to time: 'default' (the one tfsparse picks, or TFSPARSE_ISA), "
             "'all' (every variant this CPU supports, side by side), or one name")


def isas_to_run(choice):
    """The variants ``--isa choice`` asks for, checked against this CPU."""
    from tfsparse.ops import kernels

    if not kernels.available():
        return [None]
    if choice == "default":
        return [kernels.isa()]
    if choice == "all":
        return list(kernels.supported_isas())
    if choice not in kernels.supported_isas():
        raise SystemExit(f"--isa {choice}: this CPU supports {', '.join(kernels.supported_isas())}")
    return [choice]


def describe_machine(isas):
    """One line: the CPU, and the kernel variants timed."""
    from tfsparse.ops import kernels

    supported = ", ".join(kernels.supported_isas()) or "none (no compiled kernels)"
    timed = ", ".join(i for i in isas if i) or "the TensorFlow fallback"
    return f"CPU: {cpu_model()}; kernel variants supported: {supported}; timed: {timed}"
