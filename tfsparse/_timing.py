"""Side-by-side timing: candidates run interleaved, medians compared.

Used by ``sparsify(measure=...)`` and by the benchmarks (benchmarks/timing.py,
which loads this file by path: keep it free of TensorFlow and of tfsparse).
"""

import gc
import time

import numpy as np


def interleaved_medians(candidates, repeats=30, warmup=3, seed=0, calls=1):
    """Times each zero-argument callable ``repeats`` times, round-robin.

    Interleaving exposes every candidate to the same background load, so the
    ratios of the medians are meaningful on a shared, noisy machine. The
    order within each round is shuffled (seeded): a call pays for what the
    call before it left behind (evicted caches, memory to fault back in), so
    a fixed order would charge one candidate for its neighbour every time.
    As ``timeit`` does, Python's garbage collector is off while timing: a
    collection pass would land on whichever call happened to trigger it.

    ``calls``: each turn calls the candidate that many times back to back
    and keeps the last call's time. With 2 or more, a timed call follows a
    call of the same candidate (its steady state, as a server calling one
    model sees it), not whatever ran before it; the rounds still interleave.

    Returns:
      dict name -> median seconds.

    Example:
      >>> medians = interleaved_medians({"sum": lambda: sum(range(100))}, repeats=3)
      >>> list(medians), medians["sum"] > 0
      (['sum'], True)
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, received {calls}")
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
                for _ in range(calls):
                    start = time.perf_counter()
                    candidates[name]()
                    taken = time.perf_counter() - start
                samples[name].append(taken)
    finally:
        if was_enabled:
            gc.enable()
    return {name: float(np.median(times)) for name, times in samples.items()}
