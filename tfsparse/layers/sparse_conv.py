"""SparseConv2D: a Conv2D layer whose kernel is stored and computed sparse."""

import collections

import numpy as np
import scipy.sparse
import tensorflow as tf
import tensorflow_model_optimization as tfmot

from tfsparse._keras import keras
from tfsparse._keras import serializable
from tfsparse._validation import check_choice
from tfsparse._validation import check_positive_pair
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value
from tfsparse.layers import _initializers
from tfsparse.layers import _pattern_config
from tfsparse.layers._sparse_layer_args import density_setting
from tfsparse.layers._sparse_layer_args import pattern_seed
from tfsparse.layers._sparse_layer_args import set_kernel_arguments
from tfsparse.ops import SparsityPattern
from tfsparse.ops.conv import sparse_conv2d


# What for_sparse_kernel needs to scale a variance-scaling initializer with a
# conv's sparse fans: fan-in nnz / filters, fan-out nnz / cin.
_Fans = collections.namedtuple("_Fans", ["nnz", "shape"])


@serializable
class SparseConv2D(keras.layers.Layer, tfmot.sparsity.keras.PrunableLayer):
    """A channels-last ``Conv2D`` whose kernel ``(kh, kw, cin, filters)`` is sparse.

    The kernel is kept as its im2col matrix ``(kh * kw * cin, filters)``, row
    ``(i * kw + j) * cin + c``, of which only the nonzeros exist: one
    trainable vector ``values`` (column-major order) and a fixed pattern
    saved with the layer as non-trainable int32 weights (``pattern_rows``,
    ``pattern_cols``), as in ``SparseDense``. It computes with
    ``tfsparse.ops.sparse_conv2d`` on the nonzeros only (compiled direct
    sparse convolution on CPU, also under XLA as a custom call; TensorFlow's
    CSR ops on GPU and in exported SavedModels). The kernel regularizer is
    called on ``values``. ``jit_compile=True`` needs the compiled kernels
    on CPU (``tfsparse.ops.conv.xla_supported()``); elsewhere it is a
    ``ValueError``, as XLA could only compile the dense kernel.

    Args:
      filters: positive int, the number of output channels.
      kernel_size, strides, dilation_rate: a positive int or a pair of them
        (strides and dilations above 1 may be combined).
      padding: ``"valid"`` or ``"same"``.
      density: fraction of nonzeros of a random pattern, in (0, 1]; every
        filter gets ``round(density * kh * kw * cin)`` (at least 1) random
        inputs. Default 0.05. Not with ``pattern``.
      pattern: the kernel's nonzeros: an array of shape
        ``(kh, kw, cin, filters)`` (boolean: positions only, the values come
        from ``kernel_initializer``; numeric: its nonzeros are the initial
        values), or a ``scipy.sparse`` matrix ``(kh * kw * cin, filters)``.
      seed: int seed of the random pattern; ``None`` draws one at construction
        from NumPy's global generator and keeps it in the config.
      activation, use_bias, kernel_initializer, bias_initializer,
      kernel_regularizer, bias_regularizer, activity_regularizer,
      kernel_constraint, bias_constraint: as in ``keras.layers.Conv2D``; the
      kernel ones apply to ``values`` (so norm constraints over kernel axes
      and a ``GroupLasso`` are refused; variance-scaling initializers use the
      sparse fans).

    Example:
      >>> import numpy as np
      >>> layer = SparseConv2D(8, 3, padding="same", density=0.25, seed=0)
      >>> y = layer(np.ones((2, 6, 6, 4), "float32"))
      >>> y.shape, layer.nnz
      (TensorShape([2, 6, 6, 8]), 72)
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", dilation_rate=1,
                 density=None, pattern=None, seed=None, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, **kwargs):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.filters = check_positive_int("filters", filters)
        self.kernel_size = check_positive_pair("kernel_size", kernel_size)
        self.strides = check_positive_pair("strides", strides)
        self.dilation_rate = check_positive_pair("dilation_rate", dilation_rate)
        self.padding = check_choice("padding", padding, ("valid", "same"))
        self._pattern_matrix, self._pattern_values = self._check_pattern(pattern)
        self.density_setting = density_setting(density, pattern)
        self.seed = pattern_seed(seed)
        set_kernel_arguments(self, activation, use_bias, kernel_initializer, bias_initializer,
                             kernel_regularizer, bias_regularizer, kernel_constraint,
                             bias_constraint)
        if hasattr(self.kernel_regularizer, "sparse_penalty"):
            # It was applied to the vector of nonzeros: an error about "the
            # 2-D kernel (input_dim, units)" at the first call.
            raise invalid_value(
                "kernel_regularizer",
                "a regularizer of the nonzeros one by one (keras.regularizers.L1, L2, "
                "L1L2): GroupLasso's filters, channels and shapes are not computed over a "
                "SparseConv2D's nonzeros yet; regularise a Conv2D with it (callbacks.FSSL, "
                "tfsparse.fssl.compact), then tfsparse.layers.sparsify the compacted model",
                self.kernel_regularizer)
        self.input_spec = keras.layers.InputSpec(ndim=4)
        # Set by tfsparse.dynamic (RigL), as SparseDense's: ``probe(layer,
        # inputs, outputs)`` returns the pre-activation outputs, after keeping
        # the inputs and the outputs' gradient (the dense kernel's gradient is
        # their Conv2DBackpropFilter).
        self._gradient_probe = None

    def _check_pattern(self, pattern):
        """Returns (SparsityPattern over (kh*kw*cin, filters) or None, initial values or None)."""
        if pattern is None:
            return None, None
        # From get_config: the positions, packed (a scipy dok_matrix is a dict too).
        if isinstance(pattern, dict) and not scipy.sparse.issparse(pattern):
            decoded = _pattern_config.decode(pattern)
            kh, kw = self.kernel_size
            if decoded.shape[1] != self.filters or decoded.shape[0] % (kh * kw):
                raise invalid_value(
                    "pattern", f"the im2col pattern of a ({kh}, {kw}, cin, {self.filters}) kernel",
                    received=f"a config pattern of shape {tuple(decoded.shape)}")
            return decoded, None
        kh, kw = self.kernel_size
        expected = (f"an array of shape ({kh}, {kw}, cin, {self.filters}) or a scipy.sparse "
                    f"matrix of shape ({kh}*{kw}*cin, {self.filters})")
        if scipy.sparse.issparse(pattern):
            matrix, use_values = scipy.sparse.csr_matrix(pattern), True
        else:
            array = np.asarray(pattern)
            if array.ndim != 4 or array.shape[:2] != (kh, kw) or array.shape[3] != self.filters:
                raise invalid_value("pattern", expected,
                                    received=f"pattern of shape {array.shape}")
            # In its own dtype: a float64 layer keeps float64 values exactly
            # (through float32, 1 + 1e-12 rounded and 1e-50 became a zero).
            # Floats narrower than float32 (float16, ml_dtypes' bfloat16),
            # which scipy does not hold, as float32: the same values exactly.
            if array.dtype.itemsize < 4 and array.dtype.kind not in "biu":
                array = array.astype(np.float32)
            matrix = scipy.sparse.csr_matrix(array.reshape(-1, self.filters))
            use_values = array.dtype != bool
        if matrix.ndim != 2 or matrix.shape[1] != self.filters or matrix.shape[0] % (kh * kw):
            raise invalid_value("pattern", expected, received=f"pattern of shape {matrix.shape}")
        _pattern_config.check_values(matrix.data, self.dtype)
        if matrix.count_nonzero() == 0:
            raise invalid_value("pattern", "at least one nonzero", received="an all-zero pattern")
        pattern, values = SparsityPattern.from_scipy(matrix)
        return pattern, values if use_values else None

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank != 4 or input_shape[-1] is None:
            raise invalid_value(
                "inputs", "inputs of shape (batch, height, width, channels) with known channels",
                received=f"inputs of shape {input_shape}")
        self.compute_output_shape(input_shape)  # an empty output is an error, as Conv2D's
        kh, kw = self.kernel_size
        cin = int(input_shape[-1])
        shape = (kh * kw * cin, self.filters)
        if self._pattern_matrix is not None:
            pattern = self._pattern_matrix
            if pattern.shape != shape:
                raise invalid_value(
                    "pattern", f"a kernel of {cin} input channels to match the inputs "
                    f"(im2col shape {shape})", received=f"pattern of im2col shape {pattern.shape}")
        else:
            pattern = SparsityPattern.random(shape, self.density_setting, self.seed)
        self._built_pattern_digest = _pattern_config.digest(pattern.rows, pattern.cols)
        for name, array in (("pattern_rows", pattern.rows), ("pattern_cols", pattern.cols)):
            setattr(self, name, self.add_weight(
                name, shape=(pattern.nnz,), dtype=tf.int32, trainable=False,
                initializer=_initializers.from_array(array)))
        if self._pattern_values is not None:
            initializer = _initializers.from_array(self._pattern_values)
        else:
            initializer = _initializers.for_sparse_kernel(
                self.kernel_initializer, _Fans(pattern.nnz, (cin, self.filters)))
        self.values = self.add_weight(
            "values", shape=(pattern.nnz,), initializer=initializer,
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint,
            trainable=True)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                "bias", shape=(self.filters,), initializer=self.bias_initializer,
                regularizer=self.bias_regularizer, constraint=self.bias_constraint,
                trainable=True)
        self.input_channels = cin
        self.input_spec = keras.layers.InputSpec(ndim=4, axes={-1: cin})
        self.built = True

    def _pattern(self):
        """The pattern's variables as the ``pattern`` argument of sparse_conv2d."""
        return _VariablePattern(self.pattern_rows, self.pattern_cols, self._im2col_shape())

    def _im2col_shape(self):
        kh, kw = self.kernel_size
        return (kh * kw * self.input_channels, self.filters)

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != self.compute_dtype:
            inputs = tf.cast(inputs, self.compute_dtype)
        if inputs.shape.rank is None:  # as Conv2D: the shape is checked when it runs
            inputs = tf.ensure_shape(inputs, [None, None, None, self.input_channels])
        output_shape = self.compute_output_shape(inputs.shape)
        outputs = sparse_conv2d(
            inputs, self.values, self._pattern(), self.kernel_size, self.strides,
            self.padding, self.dilation_rate, bias=self.bias)
        outputs.set_shape(output_shape)
        if self._gradient_probe is not None:  # tfsparse.dynamic's RigL gradient
            outputs = self._gradient_probe(self, inputs, outputs)
        return outputs if self.activation is None else self.activation(outputs)

    def compute_output_shape(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        channels = self.input_channels if self.built else None
        if input_shape.rank != 4 or (channels is not None and input_shape[-1] is not None
                                     and input_shape[-1] != channels):
            raise invalid_value(
                "input_shape", "4 dimensions (batch, height, width, channels)"
                + (f" with {channels} channels" if channels is not None else ""),
                received=f"input_shape={input_shape}")
        sizes = []
        for size, k, s, d in zip(input_shape[1:3], self.kernel_size, self.strides,
                                 self.dilation_rate):
            if size is None:
                sizes.append(None)
            elif self.padding == "same":
                sizes.append(-(-size // s))
            else:
                sizes.append((size - (k - 1) * d - 1) // s + 1)
        if self.padding == "same" and any(size == 0 for size in input_shape[1:3]):
            raise invalid_value("input_shape", "an input of positive height and width",
                                received=f"input_shape={input_shape}")
        if any(size is not None and size <= 0 for size in sizes):
            # As Conv2D: an empty output made a model that answered its bias alone.
            raise ValueError(
                "One of the dimensions in the output of SparseConv2D is <= 0: its (dilated) "
                f"kernel {self.kernel_size} (dilation_rate {self.dilation_rate}) is larger "
                f"than the input with padding='valid'. Received input shape {input_shape}; "
                "use a larger input or padding='same'.")
        return tf.TensorShape([input_shape[0], *sizes, self.filters])

    @property
    def nnz(self):
        """Number of stored nonzeros of the kernel."""
        self._require_built("nnz")
        return int(self.values.shape[0])

    @property
    def density(self):
        """``nnz / (kh * kw * cin * filters)``."""
        return self.nnz / float(np.prod(self._im2col_shape()))

    @property
    def im2col_shape(self):
        """``(kh * kw * cin, filters)``, the shape of the kernel's sparse matrix."""
        self._require_built("im2col_shape")
        return self._im2col_shape()

    @property
    def pattern(self):
        """The current pattern over the im2col matrix, a ``SparsityPattern``."""
        self._require_built("pattern")
        return SparsityPattern(self.pattern_rows.numpy(), self.pattern_cols.numpy(),
                               self._im2col_shape())

    def set_pattern(self, pattern, values):
        """Moves the kernel's nonzeros: a new im2col pattern with as many nonzeros.

        As ``SparseDense.set_pattern``: writes the pattern's int32 weights and
        ``values`` (in the new pattern's order); every weight keeps its shape,
        the optimizer's slots of ``values`` are the caller's to permute
        (``tfsparse.dynamic`` does).

        Args:
          pattern: a ``SparsityPattern`` of shape ``im2col_shape`` and ``nnz``
            nonzeros (sorted column-major, without repeats, as it guarantees).
          values: array or tensor ``[nnz]``, the new nonzeros in its order.

        Example:
          >>> import numpy as np
          >>> layer = SparseConv2D(1, 1, pattern=np.array([[[[1.0], [0.0]]]]))
          >>> _ = layer(np.ones((1, 2, 2, 2), "float32"))
          >>> layer.set_pattern(SparsityPattern.from_coo([1], [0], (2, 1)),
          ...                   np.array([5.0], "float32"))
          >>> layer.to_dense().reshape(-1).tolist()
          [0.0, 5.0]
        """
        self._require_built("set_pattern")
        _pattern_config.check_replacement(pattern, self._im2col_shape(), self.nnz)
        self.pattern_rows.assign(pattern.rows)
        self.pattern_cols.assign(pattern.cols)
        self.values.assign(tf.reshape(tf.cast(values, self.values.dtype), [self.nnz]))

    def to_dense(self):
        """The kernel as a dense NumPy array ``(kh, kw, cin, filters)``, in the
        values' dtype."""
        values = self.values.numpy()
        kernel = self.pattern.to_scipy(values).toarray().astype(values.dtype)
        return kernel.reshape(*self.kernel_size, self.input_channels, self.filters)

    def _require_built(self, name):
        if not self.built:
            raise RuntimeError(
                f"SparseConv2D.{name} is known once the layer is built: call the layer "
                "on an input or call build((batch, height, width, channels)) first.")

    def get_prunable_weights(self):
        """tfmot's PrunableLayer interface: the values are prunable."""
        return [self.values]

    def get_config(self):
        config = super().get_config()
        # A given, moved (set_pattern) or loaded pattern travels as its packed
        # positions (clone_model and from_config rebuild the same layer); the
        # pattern drawn from the seed as the seed.
        pattern, density = None, self.density_setting
        if self.built:
            rows, cols = self.pattern_rows.numpy(), self.pattern_cols.numpy()
            if density is None or _pattern_config.digest(rows, cols) != self._built_pattern_digest:
                pattern = _pattern_config.encode(
                    SparsityPattern(rows, cols, self._im2col_shape()))
                density = None
        elif self._pattern_matrix is not None:
            pattern = _pattern_config.encode(self._pattern_matrix)
        serialize = {"activation": keras.activations.serialize,
                     "initializer": keras.initializers.serialize,
                     "regularizer": keras.regularizers.serialize,
                     "constraint": keras.constraints.serialize}
        config.update(
            filters=self.filters, kernel_size=self.kernel_size, strides=self.strides,
            padding=self.padding, dilation_rate=self.dilation_rate,
            density=density, pattern=pattern, seed=self.seed,
            use_bias=self.use_bias)
        for name in ("activation", "kernel_initializer", "bias_initializer",
                     "kernel_regularizer", "bias_regularizer", "activity_regularizer",
                     "kernel_constraint", "bias_constraint"):
            config[name] = serialize[name.rsplit("_", 1)[-1]](getattr(self, name))
        return config


_VariablePattern = collections.namedtuple("_VariablePattern", ["rows", "cols", "shape"])
