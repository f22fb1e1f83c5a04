"""GatherInputs: the selection x[:, indices], on the SpMM kernel and on tf.gather."""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfsparse import fssl
from tfsparse.ops import kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "layers"))
from layer_contract import check_layer_contract  # noqa: E402  (tests/layers/layer_contract.py)

from kernel_paths import PATHS, VARIANTS


INDICES = [5, 0, 3, 6]


def traced_ops(function, x):
    graph = tf.function(function).get_concrete_function(tf.constant(x)).graph
    return {op.type for op in graph.get_operations()}


def test_gather_inputs_layer():
    layer = fssl.GatherInputs([3, 1])
    np.testing.assert_array_equal(layer(tf.constant([[0.0, 1.0, 2.0, 3.0]])).numpy(), [[3.0, 1.0]])
    again = fssl.GatherInputs.from_config(layer.get_config())
    assert again.indices == [3, 1]
    with pytest.raises(ValueError) as info:
        fssl.GatherInputs([1, 1])
    assert str(info.value) == (
        'Received an invalid value for "indices", expected a non-empty 1-D sequence of '
        "distinct non-negative integers. Received: indices=[1, 1]")
    for booleans in ([True, 0], np.array([True, False])):  # [True, 0] was taken as [1, 0]
        with pytest.raises(ValueError, match='"indices", expected a non-empty 1-D sequence'):
            fssl.GatherInputs(booleans)


def test_index_beyond_the_input_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        fssl.GatherInputs([0, 4])(tf.zeros((2, 4)))
    assert str(info.value) == (
        'Received an invalid value for "indices", expected indices below the input '
        "dimension 4. Received: max index 4")


def test_layer_contract(tmp_path):
    # Build, config, .keras, SavedModel served without tfsparse, a training step.
    check_layer_contract(lambda: fssl.GatherInputs(INDICES), input_dim=7, tmp_path=tmp_path)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_path_selects_exactly(variant, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 7)).astype(dtype)  # 37: two full 16-row panels and a rest
    x[0, 1], x[1, 2], x[2, 4] = np.nan, np.inf, -np.inf  # in removed columns: never read
    x[3, 5], x[4, 0], x[5, 3] = np.inf, np.nan, -np.inf  # in kept columns: passed on
    layer = fssl.GatherInputs(INDICES, dtype=dtype)  # no autocast of float64 to float32
    assert "TfsparseSpmm" in traced_ops(layer, x)
    # One product by 1.0 added to 0: exact, including inf and NaN.
    np.testing.assert_array_equal(layer(x).numpy(), x[:, INDICES])
    np.testing.assert_array_equal(tf.function(layer)(x).numpy(), x[:, INDICES])


@pytest.mark.parametrize("x", [
    np.arange(2 * 3 * 7, dtype=np.float32).reshape(2, 3, 7),  # rank 3
    np.arange(14, dtype=np.int32).reshape(2, 7),               # not float32/float64
    np.arange(14, dtype=np.float16).reshape(2, 7),
])
def test_other_inputs_use_tf_gather(x):
    layer = fssl.GatherInputs(INDICES, dtype=x.dtype)
    ops = traced_ops(layer, x)
    assert "GatherV2" in ops and "TfsparseSpmm" not in ops
    np.testing.assert_array_equal(layer(x).numpy(), x[..., INDICES])


def test_input_gradient_scatters_back():
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((20, 7)).astype(np.float32))
    weight = rng.standard_normal((20, len(INDICES))).astype(np.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(fssl.GatherInputs(INDICES)(x) * weight)
    expected = np.zeros((20, 7), np.float32)
    expected[:, INDICES] = weight  # d loss / d x[:, indices[j]] = weight[:, j]; 0 elsewhere
    np.testing.assert_array_equal(tape.gradient(loss, x).numpy(), expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_saved_model_export_uses_core_ops_only(variant, tmp_path):
    module = tf.Module()
    module.layer = fssl.GatherInputs(INDICES)
    module.call = tf.function(module.layer, input_signature=[tf.TensorSpec([None, 7], tf.float32)])
    x = np.random.default_rng(2).standard_normal((5, 7)).astype(np.float32)
    assert "TfsparseSpmm" in {op.type for op in module.call.get_concrete_function().graph
                              .get_operations()}
    tf.saved_model.save(module, str(tmp_path))
    assert b"TfsparseSpmm" not in (tmp_path / "saved_model.pb").read_bytes()
    np.testing.assert_array_equal(tf.saved_model.load(str(tmp_path)).call(x).numpy(),
                                  x[:, INDICES])
