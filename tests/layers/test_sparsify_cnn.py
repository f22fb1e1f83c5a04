"""sparsify on CNNs: Conv2D -> SparseConv2D in Sequential and functional models."""

import numpy as np
import pytest
import tensorflow_model_optimization as tfmot

from tfsparse._keras import keras
from tfsparse.layers import CROSSOVER_DENSITY
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparseDense
from tfsparse.layers import sparsify
from tfsparse.layers import _conversion
from sparsify_models import branches_cnn
from sparsify_models import integer_inputs
from sparsify_models import integer_weights
from sparsify_models import residual_cnn
from sparsify_models import sequential_cnn

MODELS = [sequential_cnn, residual_cnn, branches_cnn]
KERNEL_LAYERS = (keras.layers.Conv2D, keras.layers.Dense)


def _kernel_layers(model):
    return [layer for layer in model.layers if isinstance(layer, KERNEL_LAYERS)]


@pytest.mark.parametrize("build", MODELS, ids=lambda build: build.__name__)
def test_every_layer_converts_and_outputs_are_bit_equal(build):
    model = integer_weights(build(), density=0.3)
    sparse = sparsify(model, max_density=1.0)
    x = integer_inputs(model)
    # Integer weights and inputs: every sum is exact in float32 whatever its
    # order (see sparsify_models), so the outputs are equal with no tolerance.
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), model.predict(x, verbose=0))
    for layer in _kernel_layers(model):
        twin = sparse.get_layer(layer.name)
        if isinstance(layer, keras.layers.Conv2D):
            assert isinstance(twin, SparseConv2D)
            np.testing.assert_array_equal(twin.to_dense(), layer.kernel.numpy())
            assert (twin.strides, twin.padding, twin.dilation_rate) == (
                layer.strides, layer.padding, layer.dilation_rate)
        else:
            assert isinstance(twin, SparseDense)
            np.testing.assert_array_equal(twin.to_scipy().toarray(), layer.kernel.numpy())
        assert twin.nnz == np.count_nonzero(layer.kernel.numpy())
        assert twin.activation is layer.activation
        assert twin.use_bias == layer.use_bias
        if layer.use_bias:
            np.testing.assert_array_equal(twin.bias.numpy(), layer.bias.numpy())


def test_layers_around_the_convolutions_keep_their_weights():
    model = integer_weights(residual_cnn(), density=0.3)
    sparse = sparsify(model, max_density=1.0)
    assert [type(layer).__name__ for layer in sparse.layers] == [
        type(layer).__name__.replace("Conv2D", "SparseConv2D").replace("Dense", "SparseDense")
        for layer in model.layers]
    for name in ("stem_bn", "block1_bn"):
        for a, b in zip(sparse.get_layer(name).weights, model.get_layer(name).weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


# sequential_cnn's convolutions, one of each geometry the default rule tells apart.
GEOMETRIES = {"conv1": "k x k, stride 1", "conv2": "k x k, strided", "conv3": "1 x 1"}


def test_default_rule_converts_each_convolution_below_its_geometrys_crossover(monkeypatch):
    # Made-up crossovers, so that the test decides every case whatever the
    # measured ones are: conv1 and conv2 at density 0.3 lie on either side.
    crossovers = {"k x k, stride 1": 0.5, "k x k, strided": 0.2, "1 x 1": 0.0}
    monkeypatch.setattr(_conversion, "CONV2D_CROSSOVER_DENSITY", crossovers)
    model = integer_weights(sequential_cnn(), density=0.3)
    sparse, report = sparsify(model, report=True)
    assert report.converted == ("conv1", "logits")  # and Dense, as sparsify always did
    for name, geometry in GEOMETRIES.items():
        row, limit = report[name], crossovers[geometry]
        sign = "<=" if row.converted else ">"
        assert row.reason == (f"density {row.density:.3f} {sign} max_density {limit:.3f} "
                              f"(the measured crossover of a {geometry} Conv2D)")
        assert isinstance(sparse.get_layer(name), SparseConv2D) == row.converted
    x = integer_inputs(model)
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), model.predict(x, verbose=0))


def test_measured_crossovers_cover_every_geometry():
    model = sequential_cnn()
    assert {_conversion.conv2d_geometry(model.get_layer(name)) for name in GEOMETRIES} == set(
        _conversion.CONV2D_CROSSOVER_DENSITY)
    assert all(0 <= limit <= 1 for limit in _conversion.CONV2D_CROSSOVER_DENSITY.values())
    assert CROSSOVER_DENSITY["Conv2D"] == _conversion.CONV2D_CROSSOVER_DENSITY["k x k, stride 1"]


def test_nested_model_layers_convert_and_are_reported_by_path():
    inner = integer_weights(sequential_cnn(), density=0.3)
    inputs = keras.Input((12, 12, 3))
    model = keras.Model(inputs, keras.layers.Softmax()(inner(inputs)))
    sparse, report = sparsify(model, max_density=1.0, report=True)
    assert report.converted == tuple(f"{inner.name}/{name}"
                                     for name in ("conv1", "conv2", "conv3", "logits"))
    assert isinstance(sparse.get_layer(inner.name).get_layer("conv1"), SparseConv2D)
    x = integer_inputs(model)
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), model.predict(x, verbose=0))


def test_sparsified_cnn_trains_and_round_trips_through_keras_format(tmp_path):
    model = integer_weights(residual_cnn(), density=0.3)
    sparse = sparsify(model, max_density=1.0)
    x = integer_inputs(model, batch=16) / 4
    y = np.arange(16) % 4
    sparse.compile(keras.optimizers.SGD(1e-3),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = sparse.get_layer("stem").values.numpy().copy()
    sparse.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after = sparse.get_layer("stem").values.numpy()
    assert not np.array_equal(before, after)  # the nonzeros trained
    assert sparse.get_layer("stem").nnz == before.size  # on a fixed pattern
    path = tmp_path / "sparse.keras"
    sparse.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("block2_conv2"), SparseConv2D)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), sparse.predict(x, verbose=0))


def _pruned_cnn(sparsity, x, y):
    keras.utils.set_random_seed(0)
    schedule = tfmot.sparsity.keras.ConstantSparsity(sparsity, begin_step=0, frequency=1)
    pruned = tfmot.sparsity.keras.prune_low_magnitude(residual_cnn(), pruning_schedule=schedule)
    pruned.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruned.fit(x, y, epochs=2, batch_size=16, verbose=0,
               callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])
    return pruned


def test_tfmot_pruned_cnn_after_strip_pruning_gives_the_same_outputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16, 16, 2)).astype(np.float32)
    y = (x[..., 0].mean(axis=(1, 2)) > 0).astype(int) + 2 * (x[..., 1].mean(axis=(1, 2)) > 0)
    pruned = _pruned_cnn(0.9, x, y)
    with pytest.raises(ValueError, match="strip_pruning"):
        sparsify(pruned)
    stripped = tfmot.sparsity.keras.strip_pruning(pruned)
    sparse, report = sparsify(stripped, max_density=0.2, report=True)
    assert len(report.converted) == 7  # six convolutions and the Dense layer
    for name in report.converted:
        assert report[name].density == pytest.approx(0.1, abs=0.02)
    expected = stripped.predict(x, verbose=0)
    # Each converted layer sums at most K = 3*3*12 = 108 products in another
    # order than oneDNN; float32 rounding moves such a sum by at most about
    # K * 2**-24 of the sum of its |terms|. Over the 6 layers in series (stem,
    # two per block, logits) that is 6 * 108 * 6e-8 = 3.9e-5 of the largest
    # |logit| for this net, whose BatchNorm scales are O(1).
    tolerance = 6 * 108 * 2.0**-24 * np.abs(expected).max()
    np.testing.assert_allclose(sparse.predict(x, verbose=0), expected, rtol=0, atol=tolerance)
    sparse.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sparse.fit(x, y, epochs=1, verbose=0)


def test_a_pruning_wrapper_inside_a_nested_model_is_refused():
    pruned = tfmot.sparsity.keras.prune_low_magnitude(sequential_cnn())
    inputs = keras.Input((12, 12, 3))
    with pytest.raises(ValueError, match=r"'prune_low_magnitude_conv1' is still wrapped for "
                                         r"pruning: call tfmot.sparsity.keras.strip_pruning"):
        sparsify(keras.Model(inputs, pruned(inputs)))


def test_float64_kernels_keep_their_precision():
    keras.backend.set_floatx("float64")
    try:
        model = sequential_cnn()
    finally:
        keras.backend.set_floatx("float32")
    kernel, bias = model.get_layer("conv1").get_weights()
    kernel[np.abs(kernel) < 0.2] = 0
    model.get_layer("conv1").set_weights([kernel, bias])
    sparse = sparsify(model, max_density=1.0)
    assert sparse.get_layer("conv1").values.dtype == "float64"
    np.testing.assert_array_equal(sparse.get_layer("conv1").to_dense(), kernel)


def test_mixed_precision_convolutions_convert_with_their_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = integer_weights(sequential_cnn(), density=0.3)
    finally:
        keras.mixed_precision.set_global_policy(None)  # back to floatx, as when unset
    sparse = sparsify(model, max_density=1.0)
    conv = sparse.get_layer("conv1")
    assert (conv.compute_dtype, conv.variable_dtype) == ("float16", "float32")
    x = integer_inputs(model)
    # Integer sums below 2048 are exact in float16 too (11-bit significand).
    expected = model.predict(x, verbose=0)
    assert np.abs(expected).max() < 2048
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), expected)
