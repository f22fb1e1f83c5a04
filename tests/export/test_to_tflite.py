"""SparseDense models on TFLite: builtin ops only, the interpreter equals Keras.

Every conversion here sets ``supported_ops = [TFLITE_BUILTINS]``, so a graph
that needed a Flex (TensorFlow) op fails to convert instead of passing.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse import SparseDense
from tfsparse import keras
from tfsparse.export import tflite_compatible
from tfsparse.export import to_tflite

# float32 sums of at most 60 products per unit of O(1) terms, three layers
# deep, in another order than Keras's: each output may differ by about
# 3 * 60 * 2^-24 * O(10) ~ 1e-4 at most; observed differences are ~1e-6.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _mlp():
    """The MNIST example's shape, smaller: sparse hidden layers, a Dense head."""
    return keras.Sequential([
        keras.Input((60,)),
        SparseDense(32, density=0.2, activation="relu"),
        SparseDense(24, density=0.25, activation="tanh"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def _sequence_model():
    """N-D input: SparseDense acts on the last axis; no bias; uneven fan-in."""
    pattern = scipy.sparse.random(16, 12, density=0.3, format="csr", rng=0)
    inputs = keras.Input((5, 20))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = SparseDense(12, pattern=pattern, use_bias=False, activation="sigmoid")(hidden)
    return keras.Model(inputs, SparseDense(4, density=0.5)(hidden))


MODELS = {"mlp": _mlp, "sequence": _sequence_model}


def _model(name):
    keras.utils.set_random_seed(0)
    model = MODELS[name]()
    for layer in model.layers:  # nonzero biases, so that adding them is tested
        if getattr(layer, "bias", None) is not None:
            layer.bias.assign(np.linspace(-0.5, 0.5, layer.bias.shape[0]))
    return model


def _inputs(model, batch=6):
    shape = (batch,) + tuple(model.input_shape[1:])
    return np.random.default_rng(1).random(shape).astype(np.float32)


def run_interpreter(flatbuffer, x):
    """The TFLite interpreter's output for ``x`` (any batch size)."""
    interpreter = tf.lite.Interpreter(model_content=flatbuffer)
    (inputs,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(inputs["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inputs["index"], x)
    interpreter.invoke()
    (outputs,) = interpreter.get_output_details()
    return interpreter.get_tensor(outputs["index"])


def _op_names(flatbuffer):
    interpreter = tf.lite.Interpreter(model_content=flatbuffer)
    return [op["op_name"] for op in interpreter._get_ops_details()]


def _convert_builtins_only(converter):
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 6])
@pytest.mark.parametrize("fully_connected", [False, True])
def test_to_tflite_outputs_equal_the_keras_model(name, batch, fully_connected):
    model = _model(name)
    x = _inputs(model, batch)
    flatbuffer = to_tflite(model, fully_connected=fully_connected)
    np.testing.assert_allclose(run_interpreter(flatbuffer, x), model.predict(x, verbose=0),
                               **TOLERANCE)


def test_the_file_holds_the_nonzeros_and_one_gather_per_sparse_layer():
    model = _model("mlp")
    flatbuffer = to_tflite(model)
    ops = _op_names(flatbuffer)
    # One GATHER (of the inputs) per SparseDense: the values' layout was
    # folded into a constant, not gathered at every invocation.
    assert ops.count("GATHER") == 2, ops
    nonzeros = sum(layer.nnz for layer in model.layers if isinstance(layer, SparseDense))
    dense_kernels = 60 * 32 + 32 * 24
    # value and input index per nonzero, the Dense head, biases, and the
    # flatbuffer's few kilobytes of structure; dense kernels would not fit.
    assert len(flatbuffer) < 8 * nonzeros + 4 * (24 * 10 + 66) + 8192 < 4 * dense_kernels + 8192


@pytest.mark.parametrize("inputs", [150, 49, 50, 51, 17])
def test_fully_connected_is_exact_for_input_widths_not_a_multiple_of_four(inputs):
    # TFLite's sparse FULLY_CONNECTED kernel gave wrong sums (errors of 0.6
    # to 61) for units reading the last inputs of such widths; the product
    # pads them to a multiple of 4. Sparse enough to stay sparse in the file
    # (no DENSIFY); two units read the last inputs.
    pattern = scipy.sparse.random(inputs, 20, density=0.01, format="lil", rng=inputs)
    pattern[inputs - 1, 0] = 1.0
    pattern[inputs - 2, 3] = 1.0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((inputs,)),
                              SparseDense(20, pattern=pattern.tocsr(), use_bias=False)])
    x = np.random.default_rng(2).standard_normal((3, inputs)).astype(np.float32)
    flatbuffer = to_tflite(model, fully_connected=True)
    assert "DENSIFY" not in _op_names(flatbuffer)
    # Sums of at most ~6 products of O(1) terms: float32 rounding ~1e-6.
    np.testing.assert_allclose(run_interpreter(flatbuffer, x), model(x).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_fully_connected_layers_have_their_kernels_stored_sparse():
    model = _model("mlp")
    flatbuffer = to_tflite(model, fully_connected=True)
    ops = _op_names(flatbuffer)
    assert "GATHER" not in ops and ops.count("FULLY_CONNECTED") == 3, ops
    dense_kernels = 60 * 32 + 32 * 24
    assert len(flatbuffer) < 4 * dense_kernels, len(flatbuffer)


def test_from_keras_model_converts_inside_the_scope():
    # The reported failure: SparseDense traced TensorFlow's CSR ops, which
    # TFLite has neither as builtins nor as Flex ops.
    model = _model("mlp")
    x = _inputs(model)
    with tflite_compatible():
        flatbuffer = _convert_builtins_only(tf.lite.TFLiteConverter.from_keras_model(model))
    assert "GATHER" in _op_names(flatbuffer)
    np.testing.assert_allclose(run_interpreter(flatbuffer, x), model.predict(x, verbose=0),
                               **TOLERANCE)


_WRITE_SAVED_MODEL = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import tfsparse
    model = tfsparse.keras.models.load_model(sys.argv[1])
    with tfsparse.export.tflite_compatible():
        tf.saved_model.save(model, sys.argv[2])
    """
)

_CONVERT_WITHOUT_TFSPARSE = textwrap.dedent(
    """
    import sys
    sys.modules["tfsparse"] = None  # importing tfsparse now fails
    import tensorflow as tf
    converter = tf.lite.TFLiteConverter.from_saved_model(sys.argv[1])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    with open(sys.argv[2], "wb") as file:
        file.write(converter.convert())
    """
)


def _run_fresh_process(source, *args, cwd):
    script = pathlib.Path(cwd) / "script.py"
    script.write_text(source)
    repository = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=repository)
    subprocess.run([sys.executable, str(script), *map(str, args)], check=True, env=env,
                   cwd=str(cwd), timeout=300)


def test_saved_model_written_and_converted_in_fresh_processes(tmp_path):
    model = _model("sequence")
    x = _inputs(model)
    model.save(tmp_path / "model.keras")
    _run_fresh_process(_WRITE_SAVED_MODEL, tmp_path / "model.keras", tmp_path / "saved_model",
                       cwd=tmp_path)
    _run_fresh_process(_CONVERT_WITHOUT_TFSPARSE, tmp_path / "saved_model",
                       tmp_path / "model.tflite", cwd=tmp_path)
    flatbuffer = (tmp_path / "model.tflite").read_bytes()
    np.testing.assert_allclose(run_interpreter(flatbuffer, x), model.predict(x, verbose=0),
                               **TOLERANCE)


def test_saved_model_outside_the_scope_still_serves_on_tensorflow_csr_ops(tmp_path):
    # The scope changes only what is traced inside it.
    model = _model("mlp")
    with tflite_compatible():
        pass
    tf.saved_model.save(model, str(tmp_path))
    graph_ops = {node.op for function in tf.saved_model.load(str(tmp_path)).signatures[
        "serving_default"].graph.as_graph_def().library.function for node in function.node_def}
    assert "SparseMatrixMatMul" in graph_ops


def test_a_mixed_precision_model_is_refused():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), SparseDense(4, density=0.5, name="sparse")])
    finally:
        keras.mixed_precision.set_global_policy(None)  # back to floatx, as when unset
    with pytest.raises(ValueError) as error:
        to_tflite(model)
    assert str(error.value) == (
        'Received an invalid value for "model", expected layers that compute in float32 '
        "(TFLite's builtin ops do; export a float32 copy of a mixed-precision model). "
        "Received: layer 'sparse' computes in float16 (dtype policy 'mixed_float16')"
    )


@pytest.mark.parametrize("model,expected", [
    ("a string", 'Received an invalid value for "model", expected a tf_keras Model. '
                 "Received: model=str"),
    (keras.Sequential([SparseDense(4)]),
     'Received an invalid value for "model", expected a built model (call it on data or '
     "give it an Input first). Received: an unbuilt Sequential"),
])
def test_invalid_models_are_refused(model, expected):
    with pytest.raises(ValueError) as error:
        to_tflite(model)
    assert str(error.value) == expected


def test_sparse_convolutions_are_refused_with_a_clear_error(tmp_path):
    # Before: the converter's "'tf.TfsparseSparseConvForward' op is neither a
    # custom op nor a flex op", or, inside tflite_compatible, an error naming
    # an internal tensor 'sequential/sparse_conv2d/sub_10:0'.
    from tfsparse.layers import SparseConv2D

    model = keras.Sequential([keras.Input((6, 6, 2)),
                              SparseConv2D(3, 3, density=0.5, name="sparse_conv")])
    with pytest.raises(ValueError, match="expected a model without SparseConv2D layers .* "
                                         "Received: layer 'sparse_conv' of type SparseConv2D"):
        to_tflite(model)
    with tflite_compatible(), pytest.raises(ValueError, match="sparse_conv2d \\(SparseConv2D\\) "
                                                               "has no form of TFLite builtin"):
        tf.saved_model.save(model, str(tmp_path / "saved"))
