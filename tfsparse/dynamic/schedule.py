"""RigL's and SET's schedules as plain functions: drop fraction and densities."""

import math
import numbers

import numpy as np

from tfsparse._validation import check_unit_interval
from tfsparse._validation import invalid_value

DECAYS = ("cosine", "constant", "linear")
DISTRIBUTIONS = ("erk", "er", "uniform")


def drop_fraction_at(step, drop_fraction, end_step, decay="cosine"):
    """The fraction of a layer's nonzeros an update at ``step`` moves.

    RigL's schedule (Evci et al. 2020, ``f(t) = alpha/2 (1 + cos(pi t / T))``)
    with ``decay="cosine"``; ``"constant"`` keeps ``alpha`` (SET's original
    rule) and ``"linear"`` decays it to 0 at ``end_step``. From ``end_step``
    on it is 0: the pattern stays.

    Args:
      step: the optimizer step of the update.
      drop_fraction: ``alpha``, the fraction at step 0, in [0, 1].
      end_step: the step where updates stop (RigL: 75% of training).
      decay: "cosine", "constant" or "linear".

    Returns:
      A float in ``[0, drop_fraction]``.

    Example:
      >>> drop_fraction_at(0, 0.3, 100), drop_fraction_at(50, 0.3, 100)
      (0.3, 0.15)
    """
    if decay not in DECAYS:
        raise invalid_value("decay", f"one of {DECAYS}", decay)
    drop_fraction = check_unit_interval("drop_fraction", drop_fraction)
    if step >= end_step:
        return 0.0
    progress = step / end_step
    if decay == "cosine":
        return round(drop_fraction / 2 * (1 + math.cos(math.pi * progress)), 12)
    if decay == "linear":
        return drop_fraction * (1 - progress)
    return float(drop_fraction)


def erk_densities(shapes, density, distribution="erk"):
    """Per-layer densities whose nonzeros total ``density`` of all weights.

    RigL's allocations (``get_sparsities_erdos_renyi`` in google-research/rigl):
    ``"er"`` (Erdos-Renyi, Mocanu et al.) makes a layer's density proportional
    to ``(n_in + n_out) / (n_in * n_out)``; ``"erk"`` (Erdos-Renyi-Kernel) to
    ``sum(shape) / prod(shape)``, the same for dense kernels and counting
    the kernel size of convolutions; ``"uniform"`` gives every layer
    ``density``. A layer that would exceed density 1 is made dense and the
    others are rescaled, until none does.

    Args:
      shapes: kernel shapes, e.g. ``[(784, 1024), (1024, 10)]``.
      density: the global density, in (0, 1].
      distribution: "erk", "er" or "uniform".

    Returns:
      A list of floats in (0, 1], one per shape.

    Example:
      >>> [round(d, 3) for d in erk_densities([(784, 1024), (1024, 10)], 0.1)]
      [0.089, 1.0]
    """
    if not isinstance(density, numbers.Real) or not 0 < density <= 1:
        raise invalid_value("density", "a float in (0, 1]", density)
    if distribution not in DISTRIBUTIONS:
        raise invalid_value("distribution", f"one of {DISTRIBUTIONS}", distribution)
    sizes = np.array([float(np.prod(shape)) for shape in shapes])
    if distribution == "uniform":
        return [float(density)] * len(sizes)
    if distribution == "er":
        raw = np.array([(s[-2] + s[-1]) / (s[-2] * s[-1]) for s in shapes], float)
    else:
        raw = np.array([sum(s) / np.prod(s) for s in shapes], float)
    dense = np.zeros(len(sizes), bool)
    while True:
        budget = density * sizes.sum() - sizes[dense].sum()
        scale = budget / (raw[~dense] * sizes[~dense]).sum()
        over = ~dense & (raw * scale > 1)
        if not over.any():
            return [1.0 if d else float(r * scale) for d, r in zip(dense, raw)]
        dense |= over & (raw == raw[~dense].max())
