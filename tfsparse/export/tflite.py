"""A Keras model with ``SparseDense`` layers as a TFLite model of builtin ops."""

import tensorflow as tf

from tfsparse._keras import keras
from tfsparse._validation import invalid_value
from tfsparse.layers import SparseConv2D
from tfsparse.ops.tflite import tflite_compatible


def to_tflite(model, fully_connected=False):
    """Converts a float32 Keras model to a TFLite flatbuffer with builtin ops only.

    ``SparseDense`` layers become gathers and sums over their nonzeros
    (``tflite_compatible()``), so the model needs no Flex ops and both its
    file and its memory at run time hold the nonzeros, not dense kernels.
    Other layers convert as ``tf.lite.TFLiteConverter.from_keras_model``
    converts them. The interpreter's outputs equal the model's up to float32
    rounding. No quantization is applied; mixed-precision (float16, bfloat16)
    models are refused, since TFLite's builtin ops compute in float32.

    Args:
      model: a built tf_keras ``Model`` whose layers compute in float32.
      fully_connected: ``True`` to write each ``SparseDense`` as TFLite's
        ``FULLY_CONNECTED`` instead, its kernel stored sparse in the file
        (``tf.lite.Optimize.EXPERIMENTAL_SPARSITY``, lossless). The
        interpreter then runs TFLite's sparse kernel on it or, for kernels
        it judges dense enough (5% here), expands it to a dense kernel when
        it loads the file (``DENSIFY``): memory as a ``Dense`` layer's, speed
        of TFLite's optimized dense kernels. An input width that is not a
        multiple of 4 is padded to one with zeros (a ``PAD`` op): TFLite's
        sparse kernel gave wrong sums otherwise. Conversion builds each dense
        kernel, which must be under 2 GiB. It tied with the gathers at batch
        1 on 5%-dense layers and was faster everywhere else measured
        (``python benchmarks/tflite_latency.py``, README "TFLite"). The
        dense kernel's zeros multiply every input, so an ``inf`` or ``NaN``
        in an input no nonzero reads makes every output of that row ``NaN``
        (the gathers, and the Keras model, ignore it).

    Returns:
      The TFLite model, ``bytes`` (for ``tf.lite.Interpreter(model_content=...)``
      or to write to a ``.tflite`` file).

    Raises:
      ValueError: for a model that is not a built tf_keras model computing in
        float32, one with ``SparseConv2D`` layers (no TFLite form yet), or
        ``fully_connected`` for a kernel of 2 GiB or more.
      tf.lite.ConverterError: if a layer needs ops that TFLite does not have
        as builtins.

    Example:
      >>> import numpy as np, tensorflow as tf
      >>> from tfsparse import SparseDense, keras
      >>> model = keras.Sequential([keras.Input((8,)),
      ...                           SparseDense(4, density=0.5, activation="relu")])
      >>> interpreter = tf.lite.Interpreter(model_content=to_tflite(model))
      >>> {op["op_name"] for op in interpreter._get_ops_details()} >= {"GATHER", "SUM"}
      True
    """
    _check_model(model)
    with tflite_compatible(fully_connected):
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if fully_connected:
            converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
        return converter.convert()


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise invalid_value("model", "a tf_keras Model", received=f"model={type(model).__name__}")
    if not model.built:
        raise invalid_value(
            "model", "a built model (call it on data or give it an Input first)",
            received=f"an unbuilt {type(model).__name__}")
    for layer in model.submodules:
        if isinstance(layer, SparseConv2D):
            raise invalid_value(
                "model", "a model without SparseConv2D layers (sparse convolutions have no "
                "form of TFLite builtin ops yet: export a SavedModel, or a copy with Conv2D "
                "layers of kernel SparseConv2D.to_dense())",
                received=f"layer {layer.name!r} of type SparseConv2D")
        if isinstance(layer, keras.layers.Layer) and layer.compute_dtype != "float32":
            raise invalid_value(
                "model", "layers that compute in float32 (TFLite's builtin ops do; export a "
                "float32 copy of a mixed-precision model)",
                received=f"layer {layer.name!r} computes in {layer.compute_dtype} "
                         f"(dtype policy {layer.dtype_policy.name!r})")
