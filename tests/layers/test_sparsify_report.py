"""sparsify's report and its rules: what converts, what stays dense and why."""

import numpy as np
import pytest

from tfsparse._keras import keras
from tfsparse.layers import CROSSOVER_DENSITY
from tfsparse.layers import SparseConv2D
from tfsparse.layers import SparsifyReport
from tfsparse.layers import sparsify
from tfsparse.layers import _measured_rule
from sparsify_models import integer_inputs
from sparsify_models import integer_weights

L = keras.layers


def _mixed_cnn():
    """One convertible Conv2D and one layer of every kind sparsify leaves dense."""
    inputs = keras.Input((8, 8, 4))
    x = L.Conv2D(4, 3, padding="same", name="convertible")(inputs)
    x = L.Conv2D(4, 3, padding="same", groups=2, name="grouped")(x)
    x = L.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = L.Conv2D(4, 1, kernel_constraint=keras.constraints.MaxNorm(1.0), name="max_norm")(x)
    x = L.Conv2D(4, 1, name="all_zero")(x)
    x = SparseConv2D(4, 3, padding="same", density=0.5, seed=0, name="already_sparse")(x)
    x = L.Conv2D(4, 3, padding="same", name="too_dense")(x)
    outputs = L.Conv2D(4, 1, kernel_regularizer=keras.regularizers.OrthogonalRegularizer(),
                       name="orthogonal")(x)
    model = keras.Model(inputs, outputs)
    integer_weights(model, density=0.25)
    kernel, bias = model.get_layer("all_zero").get_weights()
    model.get_layer("all_zero").set_weights([np.zeros_like(kernel), bias])
    kernel, bias = model.get_layer("too_dense").get_weights()
    model.get_layer("too_dense").set_weights([np.ones_like(kernel), bias])
    return model


def test_report_rows_say_what_converted_and_why_not_the_others():
    model = _mixed_cnn()
    sparse, report = sparsify(model, max_density=0.5, report=True)
    assert isinstance(report, SparsifyReport)
    assert report.converted == ("convertible",)
    density = np.count_nonzero(model.get_layer("convertible").kernel.numpy()) / 144
    row = report["convertible"]
    assert (row.kind, row.shape, row.density, row.converted) == (
        "Conv2D", (3, 3, 4, 4), density, True)
    assert row.reason == f"density {density:.3f} <= max_density 0.500"
    assert report.left_dense == {
        "grouped": "groups=2: SparseConv2D has no grouped convolution",
        "depthwise": "no sparse layer computes a DepthwiseConv2D",
        "max_norm": "kernel_constraint MaxNorm acts on kernel axes; the sparse layer would "
                    "apply it to its vector of nonzeros",
        "all_zero": "every weight is zero (a sparse layer needs a nonzero)",
        "already_sparse": "already sparse",
        "too_dense": "density 1.000 > max_density 0.500",
        "orthogonal": "kernel_regularizer OrthogonalRegularizer is not elementwise; the "
                      "sparse layer would apply it to its vector of nonzeros",
    }
    assert report["depthwise"].density is None
    assert [type(layer).__name__ for layer in sparse.layers][1:3] == ["SparseConv2D", "Conv2D"]
    x = integer_inputs(model)
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), model.predict(x, verbose=0))


def test_report_table_has_a_line_per_row():
    _, report = sparsify(_mixed_cnn(), max_density=0.5, report=True)
    lines = str(report).splitlines()
    assert lines[0].split() == ["layer", "kind", "kernel", "shape", "density", "converted",
                                "reason"]
    assert set(lines[1]) == {"-"}
    assert len(lines) == 2 + len(report.rows)
    assert lines[2].split()[:5] == ["convertible", "Conv2D", "3x3x4x4",
                                    f"{report['convertible'].density:.3f}", "yes"]
    assert lines[4].split()[:4] == ["depthwise", "DepthwiseConv2D", "3x3x4x1", "-"]
    with pytest.raises(KeyError, match="no layer 'nope' in the report"):
        report["nope"]


def test_channels_first_convolutions_stay_dense():
    model = keras.Sequential([keras.Input((3, 8, 8)),
                              L.Conv2D(4, 3, data_format="channels_first", name="nchw")])
    sparse, report = sparsify(model, max_density=1.0, report=True)
    assert type(sparse.get_layer("nchw")) is L.Conv2D
    assert report["nchw"].reason == ("data_format='channels_first': SparseConv2D is "
                                     "channels-last (convert the model to channels_last)")


@pytest.mark.parametrize("nonzeros, converted, reason", [
    # 3x3x4x8 = 288 weights; 0.1 of them is 28.8, so 29 nonzeros are the 0.1
    # level (as tfmot rounds a layer pruned to 90%) and 30 are above it.
    (29, True, "density 0.101 <= max_density 0.100 to the nearest whole weight (29 of 288: "
               "0.1 of them is 28.8, 29 as tfmot rounds a pruned layer's count)"),
    (30, False, "density 0.104 > max_density 0.100"),
])
def test_max_density_counts_whole_weights(nonzeros, converted, reason):
    model = keras.Sequential([keras.Input((6, 6, 4)), L.Conv2D(8, 3, name="conv")])
    kernel, bias = model.get_layer("conv").get_weights()
    kernel[...] = 0
    kernel.reshape(-1)[:nonzeros] = 1
    model.get_layer("conv").set_weights([kernel, bias])
    _, report = sparsify(model, max_density=0.1, report=True)
    assert (report["conv"].converted, report["conv"].reason) == (converted, reason)


def test_a_mapping_sets_the_limit_per_kind():
    model = integer_weights(keras.Sequential([
        keras.Input((6, 6, 2)), L.Conv2D(3, 3, name="conv"), L.Flatten(),
        L.Dense(2, name="dense")]), density=0.6)
    _, report = sparsify(model, max_density={"Conv2D": 0.9}, report=True)
    assert report.converted == ("conv", "dense")  # Dense keeps its default, 1.0
    _, report = sparsify(model, max_density=CROSSOVER_DENSITY, report=True)
    assert report.converted == ()


@pytest.mark.parametrize("sparse_seconds, converted", [(1e-3, True), (3e-3, False)])
def test_measured_rule_keeps_the_faster_layer(monkeypatch, sparse_seconds, converted):
    model = integer_weights(keras.Sequential([
        keras.Input((6, 6, 2)), L.Conv2D(3, 3, name="conv")]), density=0.9)
    calls = []

    def time_pair(dense, sparse, shape, batch_size, mode):
        calls.append((dense.name, type(sparse).__name__, shape, batch_size, mode))
        return 2e-3, sparse_seconds

    monkeypatch.setattr(_measured_rule, "time_pair", time_pair)
    sparse, report = sparsify(model, measure="training", batch_size=8, report=True)
    assert calls == [("conv", "SparseConv2D", (None, 6, 6, 2), 8, "training")]
    assert isinstance(sparse.get_layer("conv"), SparseConv2D) == converted
    assert report["conv"].reason == (
        f"faster {'sparse' if converted else 'dense'}: training, batch 8: sparse "
        f"{sparse_seconds * 1e3:.2f} ms, dense 2.00 ms")


@pytest.mark.parametrize("measure", ["inference", "training"])
def test_measured_rule_times_both_layers_for_real(measure):
    model = integer_weights(keras.Sequential([
        keras.Input((8, 8, 4)), L.Conv2D(4, 3, padding="same", name="conv")]), density=0.2)
    sparse, report = sparsify(model, measure=measure, batch_size=4, report=True)
    row = report["conv"]
    dense_ms = float(row.reason.split("dense ")[-1].split(" ms")[0])
    sparse_ms = float(row.reason.split("sparse ")[-1].split(" ms")[0])
    assert dense_ms > 0 and sparse_ms > 0
    assert row.converted == isinstance(sparse.get_layer("conv"), SparseConv2D)
    assert row.reason.startswith("faster sparse" if row.converted else "faster dense")
    # The times are printed rounded: the faster one is at most the other.
    assert (sparse_ms <= dense_ms) if row.converted else (sparse_ms >= dense_ms)
    x = integer_inputs(model)
    np.testing.assert_array_equal(sparse.predict(x, verbose=0), model.predict(x, verbose=0))


def test_measured_rule_needs_a_known_input_size():
    model = keras.Sequential([keras.Input((None, None, 2)), L.Conv2D(3, 3, name="conv")])
    _, report = sparsify(model, measure="inference", report=True)
    assert report.left_dense == {
        "conv": "input shape (None, None, None, 2) has unknown sizes: not timed"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_density={"Conv3D": 0.1}),
     "Received an invalid value for \"max_density\", expected None, a float in (0, 1] or a "
     "mapping from Dense and Conv2D to such floats. Received: max_density={'Conv3D': 0.1}"),
    (dict(max_density={"Conv2D": 1.5}), "Received: max_density={'Conv2D': 1.5}"),
    (dict(max_density=True), "Received: max_density=True"),
    (dict(measure="fast"), "Received an invalid value for \"measure\", expected None, "
                           "'inference' or 'training'. Received: measure='fast'"),
    (dict(batch_size=0), "Received an invalid value for \"batch_size\", expected a positive "
                         "integer. Received: batch_size=0"),
    (dict(report="no"), "Received: report='no'"),  # was taken as True
    (dict(report=0), "Received: report=0"),
])
def test_invalid_arguments_are_named(kwargs, message):
    model = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    with pytest.raises(ValueError) as error:
        sparsify(model, **kwargs)
    assert message in str(error.value)


def _one_dense(inputs, dtype=None):
    return keras.Model(inputs, L.Dense(3, name="d", dtype=dtype)(inputs))


@pytest.mark.parametrize("make, reason", [
    # Each crashed sparsify before, with an error about a "pattern" the user
    # never passed, scipy's float16 error, or a conversion error of the input.
    (lambda: _one_dense(keras.Input((4,))), "NaN or Inf in 1 of its weights"),
    (lambda: _one_dense(keras.Input((4,)), dtype="float16"), "a float16 kernel: sparse layers"),
    (lambda: _one_dense(keras.Input((4,)), dtype="bfloat16"), "a bfloat16 kernel"),
    (lambda: _one_dense(keras.Input((4,), sparse=True)), "its input is a SparseTensor"),
    (lambda: _one_dense(keras.Input((None, 4), ragged=True)), "its input is a RaggedTensor"),
])
def test_layers_a_sparse_twin_cannot_compute_stay_dense_with_the_reason(make, reason):
    model = make()
    if "NaN" in reason:
        kernel, bias = model.get_layer("d").get_weights()
        kernel[0, 0] = np.nan
        model.get_layer("d").set_weights([kernel, bias])
    sparse, report = sparsify(model, max_density=1.0, report=True)
    assert type(sparse.get_layer("d")) is L.Dense
    assert report["d"].reason.startswith(reason)


def test_a_kind_mapped_to_none_keeps_its_default():
    # DEFAULT_MAX_DENSITY maps Conv2D to None (its measured crossover); passing
    # it, as the README says None means, was refused.
    from tfsparse.layers import DEFAULT_MAX_DENSITY

    model = integer_weights(keras.Sequential([keras.Input((4,)), L.Dense(2, name="d")]),
                            density=0.6)
    for limit in (DEFAULT_MAX_DENSITY, {"Conv2D": None}, {"Dense": None}):
        _, report = sparsify(model, max_density=limit, report=True)
        assert report.converted == ("d",), limit


def test_wrapped_and_einsum_kernels_get_a_row_saying_they_stay_dense():
    # They had no row, though the report says why every kernel layer stays dense.
    inputs = keras.Input((3, 6))
    x = L.TimeDistributed(L.Dense(4), name="td")(inputs)
    x = L.Bidirectional(L.LSTM(2, return_sequences=True), name="bi")(x)
    x = L.EinsumDense("abc,cd->abd", output_shape=(None, 5), name="einsum")(x)
    model = keras.Model(inputs, L.TimeDistributed(L.Dropout(0.1), name="no_kernel")(x))
    _, report = sparsify(model, report=True)
    assert report.left_dense == {
        "td": "no sparse layer computes a TimeDistributed",
        "bi": "no sparse layer computes a Bidirectional",
        "einsum": "no sparse layer computes a EinsumDense"}


def test_a_time_distributed_layer_reports_the_kernel_it_applies():
    # TimeDistributed(SparseDense) was reported with the shape of its vector
    # of nonzeros, (12,), and no density.
    from tfsparse.layers import SparseDense

    inputs = keras.Input((3, 6))
    x = L.TimeDistributed(SparseDense(4, density=0.5, seed=3), name="sparse_steps")(inputs)
    outputs = L.TimeDistributed(L.Dense(2), name="dense_steps")(x)
    model = keras.Model(inputs, outputs)
    _, report = sparsify(model, report=True)
    sparse = model.get_layer("sparse_steps").layer
    assert (report["sparse_steps"].shape, report["sparse_steps"].density) == (
        (6, 4), sparse.density)
    kernel = model.get_layer("dense_steps").layer.kernel.numpy()
    assert (report["dense_steps"].shape, report["dense_steps"].density) == (
        (4, 2), np.count_nonzero(kernel) / kernel.size)
