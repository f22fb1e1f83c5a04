"""Side-by-side timing: candidates run interleaved, medians compared."""

import time

import numpy as np


def interleaved_medians(candidates, repeats=30, warmup=3):
    """Times each zero-argument callable ``repeats`` times, round-robin.

    Interleaving exposes every candidate to the same background load, so the
    ratios of the medians are meaningful on a shared, noisy machine.

    Returns:
      dict name -> median seconds.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(times)) for name, times in samples.items()}
