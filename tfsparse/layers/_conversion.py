"""What sparsify() converts: per layer, its kind, its density, what blocks it, its sparse twin.

A layer converts only when the sparse layer computes exactly what it
computes and keeps training the same way; ``blocker`` names the first reason
it would not, in words the report prints.
"""

import types

import numpy as np
import scipy.sparse

from tfsparse._keras import keras
from tfsparse.layers.sparse_conv import SparseConv2D
from tfsparse.layers.sparse_dense import SparseDense

# Where a SparseConv2D (compiled kernel) becomes faster than Conv2D
# (TensorFlow's oneDNN path), by kernel density. Measured by
#     python benchmarks/sparse_conv_speed.py --isa all --repeats 10
# (3x3, 64 -> 64 channels, 32 x 32, stride 1, "same", batch 32, float32, at
# 80/90/95/98% sparsity) on the project's 2-core Intel Xeon (AVX-512), loaded:
# sparse inference was faster from 80% sparsity on avx512 and avx2 (1.20x and
# 1.15x Conv2D at 80%) and from 90% on portable (0.71x at 80%); a training
# step from 90% on every variant (0.79-0.98x at 80%, 1.16-1.45x at 90%).
# 0.1 is the density that held for both on every variant. Strided and 1x1
# layers paid less (1.2-1.3x and 0.8-1.0x at 95%), as did the 16- and
# 32-channel layers of benchmarks/sparse_resnet.py (measured with the
# previous kernel): the rule may convert layers there that do not pay.
# Rerun the command after a kernel change and update the number.
CONV2D_CROSSOVER_DENSITY = 0.1

# Where SparseDense becomes faster than Dense (forward, batch 256):
#     python benchmarks/fssl_crossover.py
# measured 0.35 (256x256), 0.29 (512x512) and 0.30 (1024x1024) on the same
# CPU with the 16-row AVX-512 SpMM kernel (tfsparse.fssl's dense threshold).
DENSE_CROSSOVER_DENSITY = 0.3

KINDS = ("Dense", "Conv2D")

CROSSOVER_DENSITY = types.MappingProxyType({
    "Dense": DENSE_CROSSOVER_DENSITY,
    "Conv2D": CONV2D_CROSSOVER_DENSITY,
})
"""The measured crossovers per layer kind, as a ``max_density`` argument."""

DEFAULT_MAX_DENSITY = types.MappingProxyType({
    "Dense": 1.0,  # every Dense layer, as sparsify has always done
    "Conv2D": CONV2D_CROSSOVER_DENSITY,
})
"""``sparsify``'s ``max_density`` when none is given."""

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


def has_kernel(layer):
    """Whether the layer gets a row in the report: a dense or sparse kernel layer."""
    return isinstance(layer, _OTHER_KERNEL_LAYERS + _SPARSE_LAYERS)


def kernel_summary(layer):
    """``(kernel shape, density)`` of a kernel layer (density None if it has no one kernel)."""
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
    if not np.any(layer.kernel.numpy()):
        return "every weight is zero (a sparse layer needs a nonzero)"
    return _weight_rule_blocker(layer, layer_kind)


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
