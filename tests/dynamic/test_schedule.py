import math

import numpy as np
import pytest

from tfsparse.dynamic import drop_fraction_at
from tfsparse.dynamic import erk_densities


@pytest.mark.parametrize("step", [0, 1, 25, 50, 99])
def test_cosine_schedule_is_rigls(step):
    expected = 0.3 / 2 * (1 + math.cos(math.pi * step / 100))
    assert drop_fraction_at(step, 0.3, 100) == pytest.approx(expected, abs=1e-12)


def test_schedules_stop_at_end_step():
    for decay in ("cosine", "constant", "linear"):
        assert drop_fraction_at(100, 0.3, 100, decay) == 0.0
    assert drop_fraction_at(40, 0.3, 100, "constant") == 0.3
    assert drop_fraction_at(40, 0.3, 100, "linear") == pytest.approx(0.18)


def test_unknown_decay_is_refused():
    with pytest.raises(ValueError, match='"decay"'):
        drop_fraction_at(1, 0.3, 10, "step")


@pytest.mark.parametrize("bad", [1.5, -0.2, float("nan"), True, "0.3"])
def test_a_drop_fraction_outside_0_1_is_refused(bad):
    # 1.5 was returned as the fraction to move, more nonzeros than there are.
    with pytest.raises(ValueError, match=r'"drop_fraction", expected a float in \[0, 1\]'):
        drop_fraction_at(1, bad, 10)


SHAPES = [(784, 1024), (1024, 1024), (1024, 10)]


@pytest.mark.parametrize("distribution", ["erk", "er", "uniform"])
@pytest.mark.parametrize("density", [0.02, 0.1, 0.5])
def test_densities_total_the_global_density(distribution, density):
    densities = np.array(erk_densities(SHAPES, density, distribution))
    sizes = np.array([a * b for a, b in SHAPES])
    assert np.all((densities > 0) & (densities <= 1))
    assert (densities * sizes).sum() == pytest.approx(density * sizes.sum(), rel=1e-9)


def test_er_densities_are_proportional_to_the_fan_sum_over_size():
    densities = erk_densities(SHAPES[:2], 0.05, "er")
    raw = [(a + b) / (a * b) for a, b in SHAPES[:2]]
    assert densities[0] / densities[1] == pytest.approx(raw[0] / raw[1])


def test_a_layer_over_density_one_becomes_dense_and_the_others_rescale():
    densities = erk_densities(SHAPES, 0.1)
    assert densities[2] == 1.0 and densities[1] < 0.1 < densities[0] < 1


def test_erk_counts_the_kernel_size_of_convolutions():
    conv, dense = erk_densities([(3, 3, 64, 64), (576, 64)], 0.1)
    # Same n_in * n_out = 576 * 64 but ERK's sum(shape) counts 3 + 3 + 64 + 64.
    assert conv / dense == pytest.approx((3 + 3 + 64 + 64) / (576 + 64))


def test_invalid_density_and_distribution_name_the_argument():
    with pytest.raises(ValueError, match='"density"'):
        erk_densities(SHAPES, 0.0)
    with pytest.raises(ValueError, match='"distribution"'):
        erk_densities(SHAPES, 0.1, "random")
