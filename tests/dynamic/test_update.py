"""One RigL and one SET update against a NumPy reference, and the invariants."""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.dynamic import drop_and_grow
from tfsparse.dynamic import largest_conv_gradient_keys
from tfsparse.dynamic import largest_gradient_keys
from tfsparse.dynamic import layer_gradients
from tfsparse.dynamic import selection
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense
from tfsparse.ops import SparsityPattern

from rigl_reference import conv_patches
from rigl_reference import reference_update

INPUT_DIM, UNITS, BATCH = 9, 6, 5


def _trained_model(seed=0):
    """One SparseDense layer after two Adam steps (so slots are nonzero)."""
    keras.utils.set_random_seed(seed)
    layer = SparseDense(UNITS, density=0.34, seed=seed)
    model = keras.Sequential([keras.Input((INPUT_DIM,)), layer])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, INPUT_DIM)).astype(np.float32)
    y = rng.standard_normal((BATCH, UNITS)).astype(np.float32)
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    return model, layer, x, y


def _state(model, layer):
    optimizer = model.optimizer
    index = optimizer._index_dict[optimizer._var_key(layer.values)]
    return (optimizer._momentums[index], optimizer._velocities[index])


def _assert_moved_as(model, layer, keys_of, expected):
    """The layer's keys, values and Adam slots are the reference's ``(keys, values, slots)``."""
    np.testing.assert_array_equal(keys_of(layer), expected[0])
    np.testing.assert_array_equal(layer.values.numpy(), expected[1].astype(np.float32))
    for slot, reference in zip(_state(model, layer), expected[2]):
        np.testing.assert_array_equal(slot.numpy(), reference.astype(np.float32))


def _layer_keys(layer):
    return selection.keys_of(layer.pattern.rows, layer.pattern.cols, layer.input_dim)


@pytest.mark.parametrize("block_elements", [7, 1 << 20], ids=["many-blocks", "one-block"])
def test_one_rigl_update_matches_numpy(block_elements):
    model, layer, x, y = _trained_model()
    # The dense gradient of mse = mean((x W + b - y)^2): d/dz = 2 (z - y) / (B U).
    dense = layer.to_scipy().toarray()
    dz = 2 * (x @ dense + layer.bias.numpy() - y) / (BATCH * UNITS)
    gradient = x.T.astype(np.float64) @ dz  # [input_dim, units]
    _check_rigl_update(model, layer, _layer_keys, (x, y, dz), gradient,
                       lambda x, dz, taken, n: largest_gradient_keys(x, dz, taken, n,
                                                                     block_elements))


def _check_rigl_update(model, layer, keys_of, batch, gradient, scorer):
    """One RigL update (0.4) through ``layer_gradients`` and ``scorer`` against the reference.

    ``batch`` is ``(x, y, dz)`` with NumPy's ``dz``; ``gradient`` NumPy's
    dense kernel gradient ``(rows, columns)``; ``scorer(x, dz, taken, n)``
    the grow function under test.
    """
    x, y, dz = batch
    keys, values = keys_of(layer), layer.values.numpy()
    slots = [s.numpy() for s in _state(model, layer)]
    assert all(np.any(s != 0) for s in slots)
    expected = reference_update(keys, values, slots, np.abs(gradient.T.ravel()),
                                int(0.4 * layer.nnz), gradient.size)
    (inputs, output_gradients), = layer_gradients(model, [layer], x, y)
    # float32 sums of <= 18 O(1) products: 1e-5 relative is ~100 ulps.
    np.testing.assert_allclose(output_gradients.numpy(), dz, rtol=1e-5, atol=1e-7)
    new = drop_and_grow(layer, 0.4, lambda taken, n: scorer(inputs, output_gradients, taken, n),
                        optimizer=model.optimizer)
    _assert_moved_as(model, layer, keys_of, expected)
    assert new == int(np.sum(~np.isin(expected[0], keys)))


def test_one_set_update_matches_numpy():
    model, layer, _, _ = _trained_model(1)
    keys, values = _layer_keys(layer), layer.values.numpy()
    slots = [s.numpy() for s in _state(model, layer)]
    total = INPUT_DIM * UNITS
    count = int(0.3 * layer.nnz)
    # SET grows uniformly: the reference takes the same seeded draw as scores
    # (drawn keys first), so the expected positions are known.
    kept = np.sort(keys[np.lexsort((keys, np.abs(values)))[count:]])
    drawn = selection.random_free_keys(np.random.default_rng(3), total, count, kept)
    scores = np.isin(np.arange(total), drawn).astype(float)
    expected = reference_update(keys, values, slots, scores, count, total)

    rng = np.random.default_rng(3)
    drop_and_grow(layer, 0.3, lambda taken, n: selection.random_free_keys(rng, total, n, taken),
                  optimizer=model.optimizer)
    _assert_moved_as(model, layer, _layer_keys, expected)


def test_invariants_hold_over_many_updates():
    model, layer, x, y = _trained_model(2)
    nnz, total = layer.nnz, INPUT_DIM * UNITS
    rng = np.random.default_rng(0)
    for step in range(40):
        if step % 2:
            (inputs, dz), = layer_gradients(model, [layer], x, y)
            grow = lambda taken, n: largest_gradient_keys(inputs, dz, taken, n, 11)  # noqa: E731
        else:
            grow = lambda taken, n: selection.random_free_keys(rng, total, n, taken)  # noqa: E731
        drop_and_grow(layer, 0.5, grow, optimizer=model.optimizer)
        model.train_on_batch(x, y)
        keys = _layer_keys(layer)
        assert layer.nnz == nnz and keys.size == nnz
        assert np.all(np.diff(keys) > 0)  # sorted, no duplicate position
        order = layer.pattern_row_major_order.numpy()
        rows, cols = layer.pattern_rows.numpy(), layer.pattern_cols.numpy()
        np.testing.assert_array_equal(order, np.lexsort((cols, rows)))
        # The kernels compute with the moved pattern: x W + b, W from to_scipy.
        expected = x @ layer.to_scipy().toarray() + layer.bias.numpy()
        # float32 sums of <= 9 products of O(1) terms: 1e-5 absolute is ~100 ulps.
        np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-5)


def test_grow_never_picks_an_active_position_even_with_zero_gradient():
    model, layer, x, _ = _trained_model(3)
    keys = _layer_keys(layer)
    zeros = tf.zeros((BATCH, UNITS))
    grown = largest_gradient_keys(tf.constant(x), zeros, keys, 10, 5)
    assert not np.isin(grown, keys).any()
    # All scores tie at 0: the smallest free keys grow.
    free = np.setdiff1d(np.arange(INPUT_DIM * UNITS), keys)
    np.testing.assert_array_equal(grown, free[:10])


def test_an_agreed_pattern_from_another_rank_moves_values_and_slots_by_key():
    # Under Horovod, rank 0's keys replace this rank's choice: the state must
    # follow the agreed keys (kept keys keep theirs, the others start at 0).
    model, layer, _, _ = _trained_model(4)
    keys, values = _layer_keys(layer), layer.values.numpy()
    slots = [s.numpy() for s in _state(model, layer)]
    total = INPUT_DIM * UNITS
    rng = np.random.default_rng(5)
    agreed = np.sort(np.concatenate([
        rng.choice(keys, keys.size - 4, replace=False),
        rng.choice(np.setdiff1d(np.arange(total), keys), 4, replace=False)]))
    local = np.random.default_rng(6)
    new = drop_and_grow(
        layer, 0.5, lambda taken, n: selection.random_free_keys(local, total, n, taken),
        optimizer=model.optimizer, agree=lambda _: agreed)
    np.testing.assert_array_equal(_layer_keys(layer), agreed)
    at = np.searchsorted(keys, agreed).clip(max=keys.size - 1)
    old = keys[at] == agreed
    for moved, before in zip([layer.values, *_state(model, layer)], [values, *slots]):
        np.testing.assert_array_equal(moved.numpy(), np.where(old, before[at], 0))
    assert new == 4


# ---------------------------------------------------------------- SparseConv2D
CONV_INPUT, CONV_FILTERS = (BATCH, 7, 6, 3), 4


def _trained_conv_model(seed, strides=(1, 1), padding="valid", dilation=(1, 1)):
    """One SparseConv2D layer after two Adam steps (so slots are nonzero)."""
    keras.utils.set_random_seed(seed)
    layer = SparseConv2D(CONV_FILTERS, (3, 2), strides=strides, padding=padding,
                         dilation_rate=dilation, density=0.3, seed=seed)
    model = keras.Sequential([keras.Input(CONV_INPUT[1:]), layer])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(CONV_INPUT).astype(np.float32)
    y = rng.standard_normal(model.output_shape[1:]).astype(np.float32)[None].repeat(BATCH, 0)
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    return model, layer, x, y


def _conv_keys(layer):
    return selection.keys_of(layer.pattern.rows, layer.pattern.cols, layer.im2col_shape[0])


@pytest.mark.parametrize("strides, padding, dilation", [
    ((1, 1), "valid", (1, 1)), ((2, 1), "same", (1, 1)), ((1, 1), "same", (2, 2))])
def test_one_rigl_update_of_a_conv_matches_numpy(strides, padding, dilation):
    model, layer, x, y = _trained_conv_model(5, strides, padding, dilation)
    # The dense gradient by direct correlation in float64: z = patches . K + b,
    # mse's d/dz = 2 (z - y) / size, d/dK = sum over batch and pixels of patches * dz.
    patches = conv_patches(x.astype(np.float64), layer.kernel_size, strides, padding, dilation)
    z = np.einsum("bhwijc,ijcf->bhwf", patches, layer.to_dense()) + layer.bias.numpy()
    dz = 2 * (z - y) / z.size
    gradient = np.einsum("bhwijc,bhwf->ijcf", patches, dz).reshape(-1, CONV_FILTERS)
    _check_rigl_update(model, layer, _conv_keys, (x, y, dz), gradient,
                       lambda x, dz, taken, n: largest_conv_gradient_keys(layer, x, dz, taken, n))


def test_one_set_update_of_a_conv_matches_numpy_and_computes_with_the_new_pattern():
    model, layer, x, _ = _trained_conv_model(6, padding="same")
    keys, values = _conv_keys(layer), layer.values.numpy()
    slots = [s.numpy() for s in _state(model, layer)]
    total = int(np.prod(layer.im2col_shape))
    count = int(0.5 * layer.nnz)
    kept = np.sort(keys[np.lexsort((keys, np.abs(values)))[count:]])
    drawn = selection.random_free_keys(np.random.default_rng(3), total, count, kept)
    expected = reference_update(keys, values, slots, np.isin(np.arange(total), drawn), count,
                                total)

    rng = np.random.default_rng(3)
    drop_and_grow(layer, 0.5, lambda taken, n: selection.random_free_keys(rng, total, n, taken),
                  optimizer=model.optimizer)
    _assert_moved_as(model, layer, _conv_keys, expected)
    # Grown weights are 0: train a step so they are not, then the conv kernels
    # must compute with the moved pattern.
    model.train_on_batch(x, np.zeros(model.output_shape[1:], "float32")[None].repeat(BATCH, 0))
    patches = conv_patches(x, layer.kernel_size, (1, 1), "same", (1, 1))
    expected_outputs = np.einsum("bhwijc,ijcf->bhwf", patches, layer.to_dense()) + layer.bias
    # float32 sums of <= 18 O(1) products: 1e-5 absolute is ~100 ulps.
    np.testing.assert_allclose(model.predict(x, verbose=0), expected_outputs, atol=1e-5)


def test_conv_set_pattern_validates_the_pattern():
    _, layer, _, _ = _trained_conv_model(7)
    rows, filters = layer.im2col_shape
    expected = (f'Received an invalid value for "pattern", expected a pattern of shape '
                f"({rows}, {filters}) with {layer.nnz} nonzeros (the layer's). Received: ")
    with pytest.raises(ValueError) as error:
        layer.set_pattern(SparsityPattern.from_coo([0], [0], (rows, filters)), [1.0])
    assert str(error.value) == expected + f"pattern of shape ({rows}, {filters}) with 1 nonzeros"
    with pytest.raises(ValueError) as error:
        layer.set_pattern(np.ones((rows, filters)), np.ones(layer.nnz))
    assert str(error.value) == ('Received an invalid value for "pattern", expected a '
                                "tfsparse.ops.SparsityPattern. Received: pattern of type ndarray")


@pytest.mark.parametrize("fraction, nnz, moved", [(0.29, 100, 29), (0.57, 100, 57),
                                                  (0.3, 10, 3), (0.999, 100, 99)])
def test_the_count_moved_is_the_floor_of_the_decimal_product(fraction, nnz, moved):
    # In binary 0.29 * 100 is 28.999999999999996: floor took 28.
    units = nnz // 10  # 10 nonzeros a unit, in the first 10 of 20 inputs
    layer = SparseDense(units, pattern=scipy.sparse.csr_matrix(
        (np.arange(1.0, nnz + 1), (np.tile(np.arange(10), units), np.repeat(np.arange(units), 10))),
        shape=(20, units)))
    layer.build((None, 20))
    assert layer.nnz == nnz
    rng = np.random.default_rng(0)
    old = set(_layer_keys(layer).tolist())
    count = []

    def grow(taken, n):
        count.append(n)
        return selection.random_free_keys(rng, 20 * (nnz // 10), n, taken)

    drop_and_grow(layer, fraction, grow)
    assert count == [moved]
    assert len(old - set(_layer_keys(layer).tolist())) <= moved
