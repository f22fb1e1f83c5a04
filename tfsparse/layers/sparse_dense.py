"""SparseDense: a Dense layer whose kernel is stored and computed sparse."""

import collections

import numpy as np
import scipy.sparse
import tensorflow as tf
import tensorflow_model_optimization as tfmot

from tfsparse._keras import keras
from tfsparse._keras import serializable
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value
from tfsparse.layers import _initializers
from tfsparse.layers import _pattern_config
from tfsparse.layers._sparse_layer_args import density_setting
from tfsparse.layers._sparse_layer_args import pattern_seed
from tfsparse.layers._sparse_layer_args import set_kernel_arguments
from tfsparse.ops import SparsityPattern
from tfsparse.ops import sparse_matmul
from tfsparse.ops._tf_internal import read_untaped


# The pattern as tensors (the layer's non-trainable variables), in the shape
# that tfsparse.ops.sparse_matmul and sparse-aware regularizers take.
PatternTensors = collections.namedtuple(
    "PatternTensors", ["rows", "cols", "row_major_order", "shape"]
)


@serializable
class SparseDense(keras.layers.Layer, tfmot.sparsity.keras.PrunableLayer):
    """``activation(x @ W + b)`` with a sparse kernel ``W`` of shape ``(input_dim, units)``.

    Only the nonzeros of ``W`` exist: they are one trainable vector ``values``
    of length ``nnz`` (column-major order), and their positions are a fixed
    pattern, stored with the layer as non-trainable int32 weights
    (``pattern_rows``, ``pattern_cols``, ``pattern_row_major_order``) so that
    checkpoints, ``model.save`` and SavedModels carry it. Forward and backward
    passes cost time and memory proportional to ``nnz``. As ``Dense``, it
    acts on the last axis: inputs ``(batch, ..., input_dim)`` give outputs
    ``(batch, ..., units)``; a ``tf.SparseTensor`` input is made dense first
    (the same product) and a ``tf.RaggedTensor`` one maps over its flat values.

    Args:
      units: positive int, output dimension.
      density: fraction of nonzeros of a random pattern, in (0, 1]; every unit
        gets ``round(density * input_dim)`` (at least 1) random inputs. Default
        0.05. Not with ``pattern``.
      pattern: a ``scipy.sparse`` matrix of shape ``(input_dim, units)``: its
        nonzero positions are the pattern and its values the initial weights.
      seed: int seed of the random pattern; ``None`` draws one at construction
        from NumPy's global generator (so ``keras.utils.set_random_seed``
        fixes it) and keeps it in the config.
      activation, use_bias, kernel_initializer, bias_initializer,
      kernel_regularizer, bias_regularizer, activity_regularizer,
      kernel_constraint, bias_constraint: as in ``keras.layers.Dense``; the
      kernel ones apply to ``values`` (so norm constraints over kernel axes,
      ``MaxNorm``, ``MinMaxNorm``, ``UnitNorm``, are refused). Variance-scaling
      initializers (Glorot, He, LeCun) use the sparse fan-in and fan-out. A
      kernel regularizer that defines ``sparse_penalty(values, pattern)`` is
      called that way, with ``pattern`` a ``PatternTensors``; any other is
      called on ``values``.

    Example:
      >>> import numpy as np
      >>> from tfsparse._keras import keras
      >>> layer = SparseDense(16, density=0.1, seed=0, activation="relu")
      >>> y = layer(np.ones((4, 32), "float32"))
      >>> y.shape, layer.nnz
      (TensorShape([4, 16]), 48)
    """

    def __init__(
        self,
        units,
        density=None,
        pattern=None,
        seed=None,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        **kwargs,
    ):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.units = check_positive_int("units", units)
        self._pattern_matrix, self._config_pattern = self._check_pattern(pattern)
        self.density_setting = density_setting(density, pattern)
        self.seed = pattern_seed(seed)
        set_kernel_arguments(self, activation, use_bias, kernel_initializer, bias_initializer,
                             kernel_regularizer, bias_regularizer, kernel_constraint,
                             bias_constraint)
        self.supports_masking = True
        # Set by tfsparse.dynamic (RigL): ``probe(layer, inputs, outputs)``
        # returns the pre-activation outputs, after recording the inputs and
        # watching the outputs (the dense gradient of the kernel is
        # inputs^T @ d loss / d outputs).
        self._gradient_probe = None

    def _check_pattern(self, pattern):
        """Returns (scipy matrix or None, SparsityPattern from a config or None)."""
        if pattern is None:
            return None, None
        # From get_config: the encoded positions (a scipy dok_matrix is a dict too).
        if isinstance(pattern, dict) and not scipy.sparse.issparse(pattern):
            return None, self._check_config_pattern(_pattern_config.decode(pattern))
        if not scipy.sparse.issparse(pattern):
            raise invalid_value(
                "pattern", "a scipy.sparse matrix of shape (input_dim, units)",
                received=f"pattern of type {type(pattern).__name__}",
            )
        if pattern.ndim != 2 or pattern.shape[1] != self.units:
            raise invalid_value(
                "pattern",
                f"a matrix of shape (input_dim, {self.units}) (units={self.units})",
                received=f"pattern of shape {pattern.shape}",
            )
        _pattern_config.check_values(pattern.tocoo().data, self.dtype)
        if pattern.count_nonzero() == 0:
            raise invalid_value("pattern", "at least one nonzero", received="an all-zero pattern")
        return pattern, None

    def _check_config_pattern(self, pattern):
        if pattern.shape[1] != self.units:
            raise invalid_value(
                "pattern",
                f"a pattern of shape (input_dim, {self.units}) (units={self.units})",
                received=f"pattern of shape {pattern.shape}",
            )
        return pattern

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank is None or input_shape.rank < 2 or input_shape[-1] is None:
            raise invalid_value(
                "inputs", "an input of at least 2 dimensions (batch, ..., input_dim) "
                "with known input_dim",
                received=f"inputs of shape {input_shape}",
            )
        self._input_rank = input_shape.rank  # partitioners take 2-D inputs only
        input_dim = int(input_shape[-1])
        values = None
        if self._pattern_matrix is not None:
            if self._pattern_matrix.shape[0] != input_dim:
                raise invalid_value(
                    "pattern",
                    f"a matrix of shape ({input_dim}, {self.units}) to match "
                    f"the input dimension {input_dim}",
                    received=f"pattern of shape {self._pattern_matrix.shape}",
                )
            pattern, values = SparsityPattern.from_scipy(self._pattern_matrix)
        elif self._config_pattern is not None:
            pattern = self._config_pattern
            if pattern.shape[0] != input_dim:
                raise invalid_value(
                    "inputs", f"inputs of dimension {pattern.shape[0]} (the pattern's)",
                    received=f"inputs of shape {input_shape}",
                )
        else:
            pattern = SparsityPattern.random(
                (input_dim, self.units), self.density_setting, self.seed
            )
        self._add_pattern_weights(pattern)
        self._built_pattern_digest = _pattern_config.digest(pattern.rows, pattern.cols)
        if values is not None:
            initializer = _initializers.from_array(values)
        else:
            initializer = _initializers.for_sparse_kernel(
                self.kernel_initializer, pattern
            )
        self.values = self.add_weight(
            "values",
            shape=(pattern.nnz,),
            initializer=initializer,
            constraint=self.kernel_constraint,
            dtype=self.dtype,
            trainable=True,
        )
        if self.kernel_regularizer is not None:
            self.add_loss(self._kernel_penalty)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                "bias",
                shape=(self.units,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint,
                dtype=self.dtype,
                trainable=True,
            )
        self.input_dim = input_dim
        # As Dense: Keras refuses inputs of another width (a wider one was
        # multiplied by its first input_dim columns, silently).
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: input_dim})
        self.built = True

    def _add_pattern_weights(self, pattern):
        def int_weight(name, array):
            return self.add_weight(
                name,
                shape=(pattern.nnz,),
                dtype=tf.int32,
                initializer=_initializers.from_array(array),
                trainable=False,
            )

        self.pattern_rows = int_weight("pattern_rows", pattern.rows)
        self.pattern_cols = int_weight("pattern_cols", pattern.cols)
        self.pattern_row_major_order = int_weight(
            "pattern_row_major_order", pattern.row_major_order
        )

    def pattern_tensors(self):
        """The pattern as tensors: a ``PatternTensors`` of the int32 weights."""
        return PatternTensors(
            tf.convert_to_tensor(self.pattern_rows),
            tf.convert_to_tensor(self.pattern_cols),
            tf.convert_to_tensor(self.pattern_row_major_order),
            (self.input_dim, self.units),
        )

    def set_pattern(self, pattern, values):
        """Moves the kernel's nonzeros: a new pattern with as many nonzeros.

        Writes the pattern's int32 weights and ``values`` (in the new pattern's
        order); the number of nonzeros, so every weight's shape, stays. The
        optimizer's slots of ``values`` are the caller's to permute
        (``tfsparse.dynamic`` does).

        Args:
          pattern: a ``SparsityPattern`` of shape ``(input_dim, units)`` and
            ``nnz`` nonzeros (sorted, without repeats, as it guarantees).
          values: array or tensor ``[nnz]``, the new nonzeros in its order.

        Example:
          >>> import numpy as np
          >>> from tfsparse.ops import SparsityPattern
          >>> layer = SparseDense(2, density=0.5, seed=0)
          >>> _ = layer(np.ones((1, 2), "float32"))
          >>> layer.set_pattern(SparsityPattern.from_coo([1, 0], [0, 1], (2, 2)),
          ...                   np.array([3.0, 4.0], "float32"))
          >>> layer.to_scipy().toarray().tolist()
          [[0.0, 4.0], [3.0, 0.0]]
        """
        self._require_built("set_pattern")
        _pattern_config.check_replacement(pattern, (self.input_dim, self.units), self.nnz)
        self.pattern_rows.assign(pattern.rows)
        self.pattern_cols.assign(pattern.cols)
        self.pattern_row_major_order.assign(pattern.row_major_order)
        self.values.assign(tf.reshape(tf.cast(values, self.values.dtype), [self.nnz]))

    def _kernel_penalty(self):
        regularizer = self.kernel_regularizer
        with tf.name_scope("values/Regularizer"):
            if hasattr(regularizer, "sparse_penalty"):
                return regularizer.sparse_penalty(self.values, self.pattern_tensors())
            return regularizer(self.values)

    def call(self, inputs):
        if isinstance(inputs, tf.RaggedTensor):  # as Dense: the rows of its flat values
            return tf.ragged.map_flat_values(self.call, inputs)
        if isinstance(inputs, tf.SparseTensor):
            # As Dense takes one (the same product); the kernel reads dense rows.
            inputs = tf.sparse.to_dense(inputs)
        inputs = tf.convert_to_tensor(inputs)
        if inputs.shape.rank is not None and inputs.shape.rank < 2:
            raise invalid_value(
                "inputs", "an input of at least 2 dimensions (batch, ..., input_dim)",
                received=f"inputs of shape {inputs.shape}",
            )
        if inputs.dtype != self.compute_dtype:
            inputs = tf.cast(inputs, self.compute_dtype)
        leading = None
        if inputs.shape.rank is None or inputs.shape.rank > 2:
            # As Dense: the product acts on the last axis (of a rank known only
            # when the function runs, too).
            leading = tf.shape(inputs)[:-1]
            inputs = tf.reshape(inputs, [-1, self.input_dim])
        # The pattern's variables themselves: a TFLite export reads them when
        # tracing (tfsparse.export.tflite_compatible), other paths as tensors.
        # An eager call that no tape watches reads them, the values and the
        # bias with one op each (read_untaped), as serving a layer calls it.
        pattern = PatternTensors(read_untaped(self.pattern_rows), read_untaped(self.pattern_cols),
                                 self.pattern_row_major_order, (self.input_dim, self.units))
        outputs = sparse_matmul(
            inputs, read_untaped(self.values), pattern,
            bias=read_untaped(self.bias) if self.use_bias else None,
        )
        if self._gradient_probe is not None:  # tfsparse.dynamic's RigL gradient
            outputs = self._gradient_probe(self, inputs, outputs)
        if leading is not None:
            outputs = tf.reshape(outputs, tf.concat([leading, [self.units]], axis=0))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank is None:  # as the call: the rank is known when it runs
            return tf.TensorShape(None)
        width = input_shape[-1] if input_shape.rank else None
        if input_shape.rank < 2 or (self.built and width is not None
                                    and width != self.input_dim):
            expected = "at least 2 dimensions (batch, ..., input_dim)"
            raise invalid_value(
                "input_shape",
                f"{expected} with input_dim {self.input_dim}" if self.built else expected,
                received=f"input_shape={input_shape}")
        return input_shape[:-1].concatenate(self.units)

    # Properties of the kernel.
    @property
    def nnz(self):
        """Number of stored nonzeros of the kernel."""
        self._require_built("nnz")
        return int(self.values.shape[0])

    @property
    def density(self):
        """``nnz / (input_dim * units)``."""
        self._require_built("density")
        return self.nnz / (self.input_dim * self.units)

    @property
    def pattern(self):
        """The current pattern, a ``tfsparse.ops.SparsityPattern``."""
        self._require_built("pattern")
        return SparsityPattern(
            self.pattern_rows.numpy(), self.pattern_cols.numpy(),
            (self.input_dim, self.units),
        )

    def to_scipy(self):
        """The current kernel as a ``scipy.sparse.csr_matrix`` (input_dim, units);
        float32 for a float16 or bfloat16 layer (scipy.sparse has no such dtype)."""
        return self.pattern.to_scipy(self.values.numpy())

    def _require_built(self, name):
        if not self.built:
            raise RuntimeError(
                f"SparseDense.{name} is known once the layer is built: call the "
                "layer on an input or call build((batch, input_dim)) first."
            )

    def get_prunable_weights(self):
        """tfmot's PrunableLayer interface: the values are prunable."""
        return [self.values]

    def _config_pattern_entry(self):
        """None for the seed's random pattern, else the encoded positions.

        A built layer describes its current pattern, so a clone of a layer
        whose pattern moved (``tfsparse.dynamic``) or was loaded is the same
        network.
        """
        if self.built:
            rows, cols = self.pattern_rows.numpy(), self.pattern_cols.numpy()
            if self.density_setting is not None and (
                _pattern_config.digest(rows, cols) == self._built_pattern_digest
            ):
                return None
            return _pattern_config.encode(
                SparsityPattern(rows, cols, (self.input_dim, self.units))
            )
        if self._pattern_matrix is not None:
            return _pattern_config.encode(SparsityPattern.from_scipy(self._pattern_matrix)[0])
        if self._config_pattern is not None:
            return _pattern_config.encode(self._config_pattern)
        return None

    def get_config(self):
        config = super().get_config()
        density, pattern = self.density_setting, self._config_pattern_entry()
        if pattern is not None:
            density = None
        config.update(
            {
                "units": self.units,
                "density": density,
                "pattern": pattern,
                "seed": self.seed,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "activity_regularizer": keras.regularizers.serialize(self.activity_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            }
        )
        return config
