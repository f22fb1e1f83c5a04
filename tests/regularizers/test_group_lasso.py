"""GroupLasso and RegularizerSum against NumPy references, in and out of Keras."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.regularizers import GroupLasso
from tfsparse.regularizers import RegularizerSum
from tfsparse.regularizers import group_lasso_terms

GROUPS = ("'rows', 'columns', 'blocks' (Dense kernels), 'filters', 'channels', 'shapes', "
          "'blocks' (convolution kernels) or a sequence of distinct ones of one family such as "
          "('rows', 'columns')")

# float32 penalties: sums of ~100 norms each with relative error ~1e-6.
RTOL = 1e-5

Pattern = collections.namedtuple("Pattern", ["rows", "cols", "shape"])


def reference_penalty(w, l, groups, block_shape=None):
    w = w.astype(np.float64)
    total = 0.0
    for kind in (groups,) if isinstance(groups, str) else groups:
        if kind == "rows":
            total += np.linalg.norm(w, axis=1).sum()
        elif kind == "columns":
            total += np.linalg.norm(w, axis=0).sum()
        else:
            bh, bw = block_shape
            total += sum(np.linalg.norm(w[i:i + bh, j:j + bw])
                         for i in range(0, w.shape[0], bh)
                         for j in range(0, w.shape[1], bw))
    return l * total


CONFIGS = [
    dict(l=0.1, groups="rows"),
    dict(l=0.2, groups="columns"),
    dict(l=0.3, groups="blocks", block_shape=(3, 2)),
    dict(l=0.05, groups=("rows", "columns")),
    dict(l=0.05, groups=["rows", "columns", "blocks"], block_shape=[4, 4]),
]


def sparse_kernel(shape=(9, 11), density=0.35, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < density
    rows, cols = np.nonzero(mask.T)[::-1]
    values = rng.standard_normal(rows.size).astype(np.float32)
    dense = np.zeros(shape, np.float32)
    dense[rows, cols] = values
    return values, Pattern(rows.astype(np.int32), cols.astype(np.int32), shape), dense


@pytest.mark.parametrize("config", CONFIGS)
def test_standalone_call_matches_numpy(config):
    w = np.random.default_rng(1).standard_normal((9, 11)).astype(np.float32)
    got = float(GroupLasso(**config)(tf.constant(w)))
    assert got == pytest.approx(reference_penalty(w, **config), rel=RTOL)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("as_tensors", [False, True])
def test_sparse_penalty_matches_dense_reference(config, as_tensors):
    values, pattern, dense = sparse_kernel()
    if as_tensors:  # SparseDense passes its pattern as int32 tensors
        pattern = Pattern(tf.constant(pattern.rows), tf.constant(pattern.cols), pattern.shape)
    got = float(GroupLasso(**config).sparse_penalty(tf.constant(values), pattern))
    assert got == pytest.approx(reference_penalty(dense, **config), rel=RTOL)


def test_sparse_dense_layer_kernel_regularizer_loss():
    from tfsparse.layers import SparseDense

    config = dict(l=0.02, groups=("rows", "columns", "blocks"), block_shape=(4, 3))
    layer = SparseDense(10, density=0.3, seed=1, kernel_regularizer=GroupLasso(**config))
    layer(tf.ones([2, 12]))
    dense = layer.to_scipy().toarray()
    assert float(tf.add_n(layer.losses)) == pytest.approx(
        reference_penalty(dense, **config), rel=RTOL)


def test_dense_layer_kernel_regularizer_loss():
    reg = GroupLasso(0.01, groups=("rows", "columns"))
    layer = keras.layers.Dense(7, kernel_regularizer=reg)
    layer(tf.ones([2, 5]))
    kernel = layer.kernel.numpy()
    assert float(tf.add_n(layer.losses)) == pytest.approx(
        reference_penalty(kernel, 0.01, ("rows", "columns")), rel=RTOL)


def test_penalty_trains_in_fit_and_shrinks_column_norms():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)),
                              keras.layers.Dense(16, kernel_regularizer=GroupLasso(0.05)),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    before = np.linalg.norm(model.layers[0].kernel.numpy(), axis=0)
    model.fit(x, y, epochs=20, batch_size=64, verbose=0)
    after = np.linalg.norm(model.layers[0].kernel.numpy(), axis=0)
    # The group penalty's gradient pulls every column towards 0.
    assert np.median(after) < np.median(before)


def test_strength_variable_switches_penalty_inside_a_compiled_function():
    reg = GroupLasso(0.5, groups="columns")
    kernel = tf.constant([[3.0, 0.0], [4.0, 1.0]])
    traces = []

    @tf.function
    def penalty(w):
        traces.append(1)
        return reg(w)

    assert float(penalty(kernel)) == pytest.approx(0.5 * 6.0)
    reg.strength.assign(0.0)
    assert float(penalty(kernel)) == 0.0
    reg.strength.assign(reg.l)
    assert float(penalty(kernel)) == pytest.approx(3.0)
    assert len(traces) == 1


def test_sum_of_regularizers_dense_and_sparse():
    values, pattern, dense = sparse_kernel(seed=3)
    total = GroupLasso(0.1, "rows") + GroupLasso(0.2, "columns") + keras.regularizers.L2(0.3)
    assert isinstance(total, RegularizerSum) and len(total.regularizers) == 3
    expected = (reference_penalty(dense, 0.1, "rows") + reference_penalty(dense, 0.2, "columns")
                + 0.3 * float((dense.astype(np.float64) ** 2).sum()))
    assert float(total(tf.constant(dense))) == pytest.approx(expected, rel=RTOL)
    # L2 has no sparse_penalty: it is applied to the values vector.
    assert float(total.sparse_penalty(tf.constant(values), pattern)) == pytest.approx(
        expected, rel=RTOL)
    assert sum([GroupLasso(1.0), GroupLasso(2.0, "rows")]).regularizers[1].l == 2.0
    assert [t.l for t in group_lasso_terms(total)] == [0.1, 0.2]
    assert group_lasso_terms(keras.regularizers.L2(0.1)) == []


@pytest.mark.parametrize("config", CONFIGS)
def test_config_round_trip_by_behaviour(config):
    w = tf.constant(np.random.default_rng(2).standard_normal((9, 11)).astype(np.float32))
    reg = GroupLasso(**config)
    rebuilt = keras.regularizers.deserialize(keras.regularizers.serialize(reg))
    assert type(rebuilt) is GroupLasso
    assert float(rebuilt(w)) == pytest.approx(float(reg(w)), rel=1e-7)
    again = GroupLasso.from_config(reg.get_config())
    assert float(again(w)) == pytest.approx(float(reg(w)), rel=1e-7)


def test_sum_round_trips_through_a_saved_dense_model(tmp_path):
    reg = GroupLasso(0.1, "rows") + GroupLasso(0.2, "blocks", block_shape=(2, 2))
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, kernel_regularizer=reg)])
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    kernel = model.layers[0].kernel
    assert float(loaded.layers[0].kernel_regularizer(kernel)) == pytest.approx(
        float(reg(kernel)), rel=1e-7)
    assert float(tf.add_n(loaded.losses)) == pytest.approx(float(tf.add_n(model.losses)),
                                                           rel=1e-7)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"l": -1.0}, 'Received an invalid value for "l", expected a finite non-negative '
                      "float. Received: l=-1.0"),
        ({"l": "big"}, 'Received an invalid value for "l", expected a finite non-negative '
                       "float. Received: l='big'"),
        ({"groups": "kernels"},
         'Received an invalid value for "groups", expected ' + GROUPS + ". Received: groups='kernels'"),
        ({"groups": ("rows", "rows")},
         'Received an invalid value for "groups", expected ' + GROUPS + ". "
         "Received: groups=('rows', 'rows')"),
        ({"groups": [["rows"]]},  # was TypeError: unhashable type
         'Received an invalid value for "groups", expected ' + GROUPS + ". "
         "Received: groups=[['rows']]"),
        ({"groups": "blocks", "block_shape": (0, 2)},
         'Received an invalid value for "block_shape", expected a pair of positive integers '
         '(bh, bw) when groups include \'blocks\'. Received: block_shape=(0, 2)'),
        ({"groups": "rows", "block_shape": (2, 2)},
         'Received an invalid value for "block_shape", expected None unless groups include '
         "'blocks'. Received: block_shape=(2, 2) with groups='rows'"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError) as info:
        GroupLasso(**kwargs)
    assert str(info.value) == message


def test_an_integer_kernel_is_a_clear_error():
    # Was TensorFlow's Sqrt dtype error.
    with pytest.raises(ValueError, match='"x", expected a floating-point kernel. Received: x of '
                                         "dtype int32"):
        GroupLasso(0.1)(tf.ones([3, 2], tf.int32))


def test_call_on_a_vector_says_to_use_sparse_penalty():
    with pytest.raises(ValueError) as info:
        GroupLasso(0.1)(tf.ones([6]))
    assert str(info.value) == (
        'Received an invalid value for "x", expected the 2-D kernel (input_dim, units) of a '
        "dense layer for groups 'rows', 'columns', 'blocks', or a convolution kernel "
        "(*spatial, in_channels, filters) for groups 'filters', 'channels', 'shapes', "
        "'blocks'; for a sparse kernel call sparse_penalty(values, pattern). "
        "Received: x with shape (6,) and groups=('columns',)")


def test_regularizer_sum_rejects_empty_and_non_callables():
    with pytest.raises(ValueError, match=r'expected a non-empty list of regularizers. '
                                         r'Received: regularizers=\[\]'):
        RegularizerSum([])
    with pytest.raises(ValueError, match=r"Received: an element 3"):
        RegularizerSum([GroupLasso(1.0), 3])


def test_models_with_group_lasso_export_as_savedmodel(tmp_path):
    from tfsparse.layers import SparseDense

    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(4, kernel_regularizer=GroupLasso(0.1) + GroupLasso(0.2, "rows")),
        SparseDense(3, density=0.5, seed=0, kernel_regularizer=GroupLasso(0.1)),
    ])
    # The strength variable is reachable for export but is not a layer weight.
    assert [len(layer.weights) for layer in model.layers] == [2, 5]
    tf.saved_model.save(model, str(tmp_path))
    served = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    (output,) = served(tf.constant(x)).values()
    np.testing.assert_allclose(output.numpy(), model(x).numpy(), rtol=1e-6)


def test_without_group_lasso_keeps_the_other_terms():
    from tfsparse.regularizers import without_group_lasso

    l2 = keras.regularizers.L2(0.1)
    assert without_group_lasso(GroupLasso(1.0)) is None
    assert without_group_lasso(GroupLasso(1.0) + l2) is l2
    assert without_group_lasso(l2) is l2
    assert without_group_lasso(None) is None
    rest = without_group_lasso(GroupLasso(1.0) + l2 + keras.regularizers.L1(0.2))
    assert isinstance(rest, RegularizerSum) and len(rest.regularizers) == 2
