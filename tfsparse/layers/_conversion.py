"""What sparsify() converts: per layer, its kind, its density, what blocks it, its sparse twin.

A layer converts only when the sparse layer computes exactly what it
computes and keeps training the same way; ``blocker`` names the first reason
it would not, in words the report prints.
"""

import types

import numpy as np
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.layers.sparse_conv import SparseConv2D
from tfsparse.layers.sparse_dense import SparseDense

# Where a SparseConv2D (compiled kernel) becomes faster than Conv2D
# (TensorFlow's oneDNN path), by kernel density, per geometry: the density
# below which both inference and a training step (input gradient included)
# were faster on every kernel variant, as printed by
#     python benchmarks/sparse_conv_speed.py --isa all --conv2d-isa native --repeats 10
# (64 -> 64 channels, 32 x 32, "same", batch 32, float32, at 80/90/95/98%
# sparsity; "crossover density per geometry"), on the project's 2-core Intel
# Xeon (AVX-512), machine quiet (load 0.9-1.7). Native (every variant against
# this CPU's AVX-512 oneDNN) gives the lower densities; the default,
# Conv2D capped at each variant's CPUs, gave 0.2 for every geometry (1x1 0.1
# once). 0 would mean sparse was not
# faster in some mode on some variant even at 98%: sparsify's default would
# leave such layers dense. Narrower layers pay less than these 64-channel ones (see
# benchmarks/sparse_resnet.py); ``sparsify(measure=...)`` times each layer on
# its own shape. Rerun the command after a kernel change and update them.
CONV2D_CROSSOVER_DENSITY = types.MappingProxyType({
    "k x k, stride 1": 0.1,  # 3x3: faster from 80% (avx512, avx2) and 90% (portable)
    "k x k, strided": 0.1,  # 3x3, stride 2: training step from 90% on every variant
    "1 x 1": 0.02,  # inference 0.84-1.00x on some variant at 80-95% (a second run: 0.05)
})

# Where SparseDense becomes faster than Dense (forward, batch 256):
#     python benchmarks/fssl_crossover.py
# measured 0.35 (256x256), 0.29 (512x512) and 0.30 (1024x1024) on the same
# CPU with the 16-row AVX-512 SpMM kernel (tfsparse.fssl's dense threshold).
DENSE_CROSSOVER_DENSITY = 0.3

KINDS = ("Dense", "Conv2D")

CROSSOVER_DENSITY = types.MappingProxyType({
    "Dense": DENSE_CROSSOVER_DENSITY,
    "Conv2D": CONV2D_CROSSOVER_DENSITY["k x k, stride 1"],
})
"""The measured crossovers per layer kind, as a ``max_density`` argument
(Conv2D's of a k x k kernel at stride 1; sparsify's default tells the
geometries apart)."""

DEFAULT_MAX_DENSITY = types.MappingProxyType({
    "Dense": 1.0,  # every Dense layer, as sparsify has always done
    "Conv2D": None,  # its geometry's measured crossover (CONV2D_CROSSOVER_DENSITY)
})
"""``sparsify``'s ``max_density`` when none is given; ``None`` is by geometry."""


def conv2d_geometry(layer):
    """The key of a Conv2D's geometry in ``CONV2D_CROSSOVER_DENSITY``."""
    if tuple(layer.kernel_size) == (1, 1):
        return "1 x 1"
    return "k x k, stride 1" if tuple(layer.strides) == (1, 1) else "k x k, strided"

# Layers with a kernel that have no sparse twin: they get a row in the report.
_OTHER_KERNEL_LAYERS = (
    keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
    keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D, keras.layers.SeparableConv2D,
)
_SPARSE_LAYERS = (SparseDense, SparseConv2D)

_COMMON_SETTINGS = (
    "activation", "use_bias", "kernel_initializer", "bias_initializer",
    "kernel_regularizer", "bias_regularizer", "activity_regularizer",
    "kernel_constraint", "bias_constraint", "name", "dtype", "trainable",
)
_CONV_SETTINGS = ("strides", "padding", "dilation_rate")


def kind(layer):
    """"Dense" or "Conv2D" for a layer sparsify can convert, else None (exact types only)."""
    name = type(layer).__name__
    if name in KINDS and type(layer) is getattr(keras.layers, name):
        return name
    return None


# Layers holding a kernel that no sparse layer computes, reported as left dense
# (the kernels inside a wrapper are its wrapped layer's).
_REPORTED_ONLY = (keras.layers.EinsumDense, keras.layers.TimeDistributed,
                  keras.layers.Bidirectional)


def has_kernel(layer):
    """Whether the layer gets a row in the report: a dense or sparse kernel layer."""
    if isinstance(layer, _REPORTED_ONLY):
        return bool(layer.weights)
    return isinstance(layer, _OTHER_KERNEL_LAYERS + _SPARSE_LAYERS)


def kernel_summary(layer):
    """``(kernel shape, density)`` of a kernel layer (density None if it has no one kernel)."""
    inner = getattr(layer, "layer", None)
    if isinstance(layer, keras.layers.TimeDistributed) and has_kernel(inner):
        return kernel_summary(inner)  # the layer it applies at every step
    if isinstance(layer, SparseDense):
        return tuple(layer.pattern.shape), layer.density
    if isinstance(layer, SparseConv2D):
        return (*layer.kernel_size, layer.input_channels, layer.filters), layer.density
    kernel = getattr(layer, "kernel", None)
    if kernel is None:  # depthwise and separable convolutions
        return tuple(layer.weights[0].shape), None
    kernel = kernel.numpy()
    return kernel.shape, float(np.count_nonzero(kernel)) / max(kernel.size, 1)


def blocker(layer):
    """Why ``layer`` cannot become its sparse twin exactly, or None if it can."""
    if isinstance(layer, _SPARSE_LAYERS):
        return "already sparse"
    layer_kind = kind(layer)
    if layer_kind is None:
        return f"no sparse layer computes a {type(layer).__name__}"
    if not layer.built:
        return "not built"
    config = layer.get_config()
    if layer_kind == "Conv2D":
        if config["data_format"] != "channels_last":
            return (f"data_format={config['data_format']!r}: SparseConv2D is channels-last "
                    "(convert the model to channels_last)")
        if config["groups"] != 1:
            return f"groups={config['groups']}: SparseConv2D has no grouped convolution"
    if layer.kernel.shape.rank != (2 if layer_kind == "Dense" else 4):
        return f"a kernel of shape {tuple(layer.kernel.shape)}"
    if layer.kernel.dtype.base_dtype not in (tf.float32, tf.float64):
        return (f"a {layer.kernel.dtype.base_dtype.name} kernel: sparse layers store float32 "
                "or float64 values (mixed-precision policies keep float32 variables)")
    kernel = layer.kernel.numpy()
    if not np.any(kernel):
        return "every weight is zero (a sparse layer needs a nonzero)"
    nonfinite = int(np.count_nonzero(~np.isfinite(kernel)))
    if nonfinite:
        return f"NaN or Inf in {nonfinite:,} of its weights (a sparse pattern holds finite values)"
    composite = _composite_input(layer)
    if composite is not None:
        return f"its input is a {composite} ({type(layer).__name__} reads it, sparse layers do not)"
    return _weight_rule_blocker(layer, layer_kind)


def _composite_input(layer):
    """``"SparseTensor"`` or ``"RaggedTensor"`` when a call of ``layer`` receives one, else None."""
    for node in layer.inbound_nodes:
        for tensor in tf.nest.flatten(node.input_tensors):
            spec = getattr(tensor, "type_spec", None)
            if isinstance(spec, tf.SparseTensorSpec):
                return "SparseTensor"
            if isinstance(spec, tf.RaggedTensorSpec):
                return "RaggedTensor"
    return None


def _weight_rule_blocker(layer, layer_kind):
    """A constraint or regularizer that would act differently on the nonzeros alone."""
    constraint = layer.kernel_constraint
    if constraint is not None and not isinstance(constraint, keras.constraints.NonNeg):
        return (f"kernel_constraint {type(constraint).__name__} acts on kernel axes; the "
                "sparse layer would apply it to its vector of nonzeros")
    regularizer = layer.kernel_regularizer
    elementwise = (keras.regularizers.L1, keras.regularizers.L2, keras.regularizers.L1L2)
    sparse_aware = layer_kind == "Dense" and hasattr(regularizer, "sparse_penalty")
    if regularizer is not None and not isinstance(regularizer, elementwise) and not sparse_aware:
        return (f"kernel_regularizer {type(regularizer).__name__} is not elementwise; the "
                "sparse layer would apply it to its vector of nonzeros")
    return None


def to_sparse(layer):
    """The sparse twin of a Dense or Conv2D ``layer``: its nonzeros, bias and settings."""
    config = layer.get_config()
    settings = {key: config[key] for key in _COMMON_SETTINGS if key in config}
    kernel = layer.kernel.numpy()
    # A scipy matrix keeps the kernel's dtype (an array pattern would be float32).
    if kind(layer) == "Dense":
        sparse = SparseDense(config["units"], pattern=scipy.sparse.csr_matrix(kernel),
                             **settings)
        sparse.build((None, kernel.shape[0]))
    else:
        settings.update({key: config[key] for key in _CONV_SETTINGS})
        matrix = scipy.sparse.csr_matrix(kernel.reshape(-1, kernel.shape[-1]))
        sparse = SparseConv2D(config["filters"], config["kernel_size"], pattern=matrix,
                              **settings)
        sparse.build((None, None, None, kernel.shape[2]))
    if layer.use_bias:
        sparse.bias.assign(layer.bias)
    return sparse
