"""Error feedback: what a compressor leaves out is added back at the next step."""

import tensorflow as tf

from tfsparse import _validation

NONFINITE_POLICIES = ("raise", "skip")


def _residual_name(variable):
    name = variable.name.split(":")[0].replace("/", "_")
    return f"residual_{name}"


class ErrorFeedback(tf.Module):
    """Keeps, per variable, the residual ``(g + r) - decompress(compress(g + r))``.

    One `ErrorFeedback` compresses the gradients of a list of variables as one
    flat buffer (pass a single variable for per-tensor compression). The
    residuals are non-trainable variables shaped like the model variables,
    created here and tracked by this module, so a `tf.train.Checkpoint` (or
    `model.save_weights` in the TensorFlow format) that holds the optimizer
    saves and restores them: resuming training loses nothing.

    Non-finite gradients (NaN or Inf) raise an `InvalidArgumentError` naming
    the variable, or, with ``nonfinite="skip"``, send nothing for that
    gradient and leave its residual unchanged.

    Args:
        compressor: a `tfsparse.compression.Compressor`.
        variables: the variables whose gradients are compressed (one buffer).
        nonfinite: "raise" or "skip".
        name: optional module name.

    Example:
        >>> import tensorflow as tf
        >>> from tfsparse.compression import TopK
        >>> weights = tf.Variable(tf.zeros([4]))
        >>> feedback = ErrorFeedback(TopK(0.25), [weights])
        >>> values, indices = feedback.compress([tf.constant([1.0, -3.0, 2.0, 0.5])])
        >>> values.numpy().tolist(), feedback.residuals[0].numpy().tolist()
        ([-3.0], [1.0, 0.0, 2.0, 0.5])
    """

    def __init__(self, compressor, variables, nonfinite="raise", name=None):
        super().__init__(name=name)
        self.compressor = compressor
        self._nonfinite = _validation.check_choice("nonfinite", nonfinite, NONFINITE_POLICIES)
        variables = list(variables)
        if not variables:
            raise _validation.invalid_value("variables", "at least one variable", variables)
        dtypes = {v.dtype.base_dtype for v in variables}
        if len(dtypes) != 1:
            raise _validation.invalid_value(
                "variables", "variables of a single dtype (one buffer is compressed)",
                received=f"variables of dtypes {sorted(d.name for d in dtypes)}",
            )
        self.dtype = variables[0].dtype.base_dtype
        self.variable_names = [v.name for v in variables]
        self.shapes = [v.shape for v in variables]
        self.sizes = [v.shape.num_elements() for v in variables]
        self.size = sum(self.sizes)
        with self.name_scope:
            self.residuals = [
                tf.Variable(tf.zeros(v.shape, self.dtype), trainable=False, name=_residual_name(v))
                for v in variables
            ]

    def _finite(self, gradient, name):
        if self._nonfinite == "raise":
            return tf.debugging.check_numerics(
                gradient, f"Non-finite gradient (NaN or Inf) for variable {name}"
            )
        return gradient

    def compress(self, gradients):
        """Compresses ``gradients + residuals`` and keeps what is not sent.

        Args:
            gradients: list of tensors shaped like the variables.

        Returns:
            `(values, indices)` of the compressor, indexing the flat
            concatenation of the variables in order.
        """
        gradients = [tf.convert_to_tensor(g, self.dtype) for g in gradients]
        corrected, finite = [], []
        for gradient, residual, name in zip(gradients, self.residuals, self.variable_names):
            flat = tf.reshape(self._finite(gradient, name) + residual, [-1])
            if self._nonfinite == "skip":
                is_finite = tf.reduce_all(tf.math.is_finite(gradient))
                flat = tf.where(is_finite, flat, tf.zeros_like(flat))
                finite.append(is_finite)
            corrected.append(flat)
        buffer = corrected[0] if len(corrected) == 1 else tf.concat(corrected, 0)
        values, indices = self.compressor.compress(buffer)
        left = buffer - self.compressor.decompress(values, indices, self.size)
        for i, (part, residual) in enumerate(zip(tf.split(left, self.sizes), self.residuals)):
            part = tf.reshape(part, residual.shape)
            if self._nonfinite == "skip":
                part = tf.where(finite[i], part, residual)
            residual.assign(part)
        return values, indices

    def decompress(self, values, indices, scale=None):
        """Rebuilds the gradients (list shaped like the variables), times `scale` if given."""
        dense = self.compressor.decompress(values, indices, self.size)
        return self.split(dense if scale is None else dense * tf.cast(scale, dense.dtype))

    def split(self, flat):
        """Splits a flat buffer back into tensors shaped like the variables."""
        return [tf.reshape(part, shape) for part, shape in zip(tf.split(flat, self.sizes), self.shapes)]
