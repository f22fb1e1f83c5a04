"""The optimizer state that follows a moving pattern: slots and residuals.

tfsparse.dynamic._optimizer_state reads private attributes of Keras's
optimizers; these tests fail loudly when an upgrade moves them.
"""

import numpy as np
import pytest

from tfsparse._keras import keras
from tfsparse.compression import TopK
from tfsparse.dynamic import _optimizer_state
from tfsparse.dynamic import drop_and_grow
from tfsparse.dynamic import selection
from tfsparse.layers import SparseDense

OPTIMIZERS = {
    "adam": (lambda: keras.optimizers.Adam(0.01), 2),
    "adam-amsgrad": (lambda: keras.optimizers.Adam(0.01, amsgrad=True), 3),
    "sgd-momentum": (lambda: keras.optimizers.SGD(0.01, momentum=0.9), 1),
    "legacy-adam": (lambda: keras.optimizers.legacy.Adam(0.01), 2),
    "legacy-sgd-momentum": (lambda: keras.optimizers.legacy.SGD(0.01, momentum=0.9), 1),
    "rmsprop": (lambda: keras.optimizers.RMSprop(0.01), 1),
}


def _trained(optimizer):
    keras.utils.set_random_seed(0)
    layer = SparseDense(5, density=0.4, seed=0)
    model = keras.Sequential([keras.Input((8,)), layer])
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 8)), rng.standard_normal((6, 5))
    model.fit(x, y, epochs=2, verbose=0)
    return model, layer


def _drop_half_and_grow(layer, optimizer, rng):
    """Moves half the layer's nonzeros at random; returns each new position's old one (-1: grown)."""
    old_keys = selection.keys_of(layer.pattern.rows, layer.pattern.cols, 8)
    drop_and_grow(layer, 0.5, lambda taken, n: selection.random_free_keys(rng, 40, n, taken),
                  optimizer=optimizer)
    return selection.new_order(
        old_keys, selection.keys_of(layer.pattern.rows, layer.pattern.cols, 8))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_slots_of_the_values_are_found_and_move_with_them(name):
    make, count = OPTIMIZERS[name]
    model, layer = _trained(make())
    slots = _optimizer_state.slots_of(model.optimizer, layer.values)
    assert len(slots) == count
    assert all(s.shape == layer.values.shape and np.any(s.numpy() != 0) for s in slots)
    before = [s.numpy() for s in slots]
    source = _drop_half_and_grow(layer, model.optimizer, np.random.default_rng(0))
    assert np.any(source < 0)
    for slot, old in zip(slots, before):
        np.testing.assert_array_equal(slot.numpy()[source >= 0], old[source[source >= 0]])
        np.testing.assert_array_equal(slot.numpy()[source < 0], 0)


def test_no_slots_before_the_first_step():
    layer = SparseDense(3, density=0.5, seed=0)
    layer.build((None, 4))
    assert _optimizer_state.slots_of(keras.optimizers.Adam(), layer.values) == []


def test_error_feedback_residuals_move_with_the_values():
    hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")
    from tfsparse.horovod import DistributedOptimizer

    hvd.init()
    model, layer = _trained(DistributedOptimizer(keras.optimizers.SGD(0.01), TopK(0.2)))
    residual = _optimizer_state.residual_of(model.optimizer, layer.values)
    assert residual is not None and np.any(residual.numpy() != 0)
    state = _optimizer_state.position_state(model.optimizer, layer.values)
    assert any(s is residual for s in state)
    before = residual.numpy()
    source = _drop_half_and_grow(layer, model.optimizer, np.random.default_rng(1))
    np.testing.assert_array_equal(residual.numpy()[source >= 0], before[source[source >= 0]])
    np.testing.assert_array_equal(residual.numpy()[source < 0], 0)


def test_gradient_sums_between_two_exchanges_move_with_the_values():
    # backward_passes_per_step=2: a pattern update between two exchanges left
    # the sum of the first pass in the old order, so the exchange applied
    # gradients to the wrong connections (grown ones included), silently.
    hvd = pytest.importorskip("horovod.tensorflow.keras", reason="Horovod is not installed")
    from tfsparse.horovod import DistributedOptimizer

    hvd.init()
    keras.utils.set_random_seed(0)
    layer = SparseDense(5, density=0.4, seed=0)
    model = keras.Sequential([keras.Input((8,)), layer])
    model.compile(DistributedOptimizer(keras.optimizers.SGD(0.01),
                                       backward_passes_per_step=2), "mse")
    rng = np.random.default_rng(0)
    model.fit(rng.standard_normal((6, 8)), rng.standard_normal((6, 5)), epochs=3, verbose=0)
    accumulated = _optimizer_state.accumulated_of(model.optimizer, layer.values)
    assert int(model.optimizer.gradient_accumulator.counter.numpy()) == 1  # one pass summed
    assert accumulated is not None and np.any(accumulated.numpy() != 0)
    assert any(s is accumulated for s in
               _optimizer_state.position_state(model.optimizer, layer.values))
    before = accumulated.numpy()
    source = _drop_half_and_grow(layer, model.optimizer, rng)
    assert np.any(source < 0)
    np.testing.assert_array_equal(accumulated.numpy()[source >= 0], before[source[source >= 0]])
    np.testing.assert_array_equal(accumulated.numpy()[source < 0], 0)


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.Ftrl(0.01, initial_accumulator_value=0.3),
    lambda: keras.optimizers.Adagrad(0.01, initial_accumulator_value=0.3),
    lambda: keras.optimizers.legacy.Ftrl(0.01, initial_accumulator_value=0.3),
    lambda: keras.optimizers.legacy.Adagrad(0.01, initial_accumulator_value=0.3),
], ids=["ftrl", "adagrad", "legacy-ftrl", "legacy-adagrad"])
def test_grown_accumulators_start_where_a_fresh_weight_s_do(make):
    # At 0, Ftrl's update (a power of the accumulator in a denominator)
    # turned the grown weights into NaN one step after the update.
    model, layer = _trained(make())
    slots = _optimizer_state.slots_of(model.optimizer, layer.values)
    fresh = [_optimizer_state.fresh_value(model.optimizer, layer.values, s) for s in slots]
    assert sorted(fresh) == ([0.0, 0.3] if len(slots) == 2 else [0.3])  # Ftrl's linear: 0
    before = [s.numpy() for s in slots]
    source = _drop_half_and_grow(layer, model.optimizer, np.random.default_rng(2))
    assert np.any(source < 0)
    for slot, old, value in zip(slots, before, fresh):
        np.testing.assert_array_equal(slot.numpy()[source >= 0], old[source[source >= 0]])
        np.testing.assert_allclose(slot.numpy()[source < 0], value)
    x = np.random.default_rng(3).standard_normal((6, 8))
    model.fit(x, np.zeros((6, 5)), verbose=0)
    assert np.all(np.isfinite(layer.values.numpy()))
