"""Error feedback: what a compressor leaves out is added back at the next step."""

import tensorflow as tf

from tfsparse import _validation
from tfsparse.compression.base import INDEX_DTYPE

_MAX_INT32 = 2**31 - 1

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

    A gradient that is not finite (NaN or Inf), or whose sum with its
    residual overflows to Inf, raises an `InvalidArgumentError` naming the
    variable, or, with ``nonfinite="skip"``, sends nothing for that variable
    and leaves its residual unchanged. (Checking the gradient alone would let
    an overflowing sum through: the compressor would send an Inf and keep
    ``Inf - Inf``, a NaN residual, for every later step.)

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

    def _checked(self, corrected, name):
        """``(corrected, finite)``: the gradient plus its residual, checked.

        "raise": an error unless every element is finite (``finite`` is
        None); "skip": ``corrected`` with zeros in place of a non-finite one,
        and ``finite`` whether it was.
        """
        if self._nonfinite == "raise":
            return tf.debugging.check_numerics(
                corrected,
                f"Non-finite gradient (NaN or Inf) for variable {name}, or its sum with the "
                "error-feedback residual overflowed",
            ), None
        finite = tf.reduce_all(tf.math.is_finite(corrected))
        return tf.where(finite, corrected, tf.zeros_like(corrected)), finite

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
            flat, is_finite = self._checked(tf.reshape(gradient + residual, [-1]), name)
            corrected.append(flat)
            finite.append(is_finite)
        buffer = corrected[0] if len(corrected) == 1 else tf.concat(corrected, 0)
        values, indices = self.compressor._compress_finite(buffer)  # noqa: SLF001 (checked above)
        left = buffer - self.compressor.decompress(values, indices, self.size)
        for i, (part, residual) in enumerate(zip(tf.split(left, self.sizes), self.residuals)):
            part = tf.reshape(part, residual.shape)
            if self._nonfinite == "skip":
                part = tf.where(finite[i], part, residual)
            residual.assign(part)
        return values, indices

    def compress_slices(self, slices):
        """Compresses a row-sparse gradient (``tf.IndexedSlices``) of the one variable.

        The gradient's rows are summed per distinct row (an embedding row
        looked up twice in a batch appears twice), the residual of those rows
        is added, and the compressor selects among the elements of these rows
        only. What it leaves out goes back to those rows' residual; the
        residual of a row the gradient does not touch waits until a later
        gradient touches it (it is never sent on its own, so the rows a step
        sends stay the rows it touched). A row summed from its duplicates and
        its residual is checked as `compress` checks a gradient: with
        ``nonfinite="skip"`` a non-finite one sends nothing and leaves every
        residual unchanged.

        Args:
            slices: a `tf.IndexedSlices` for the single variable of this
                `ErrorFeedback`; its values have the variable's row shape.

        Returns:
            `(values, indices)` in the same form as `compress`: int32
            positions in the flattened variable, so `decompress` (or any
            scatter-add into the variable's shape) rebuilds the sent gradient.
        """
        if len(self.residuals) != 1:
            raise ValueError(
                "compress_slices compresses the gradient of a single variable; this "
                f"ErrorFeedback holds {len(self.residuals)} variables."
            )
        if self.size > _MAX_INT32:
            raise ValueError(
                f"Row-sparse gradients are indexed with int32; variable {self.variable_names[0]} "
                f"has {self.size} elements; split it into parts of fewer than 2**31 elements."
            )
        residual, name = self.residuals[0], self.variable_names[0]
        row_shape = self.shapes[0][1:]
        row_size = row_shape.num_elements()
        gradient = tf.convert_to_tensor(slices.values, self.dtype)
        rows, slot = tf.unique(tf.cast(slices.indices, INDEX_DTYPE))
        summed = tf.math.unsorted_segment_sum(gradient, slot, tf.size(rows))
        flat, is_finite = self._checked(tf.reshape(summed + tf.gather(residual, rows), [-1]), name)
        values, local = self.compressor._compress_finite(flat)  # noqa: SLF001 (checked above)
        left = tf.reshape(flat - self.compressor.decompress(values, local, tf.size(flat)),
                          [-1] + row_shape.as_list())
        if self._nonfinite == "skip":
            left = tf.where(is_finite, left, tf.gather(residual, rows))
        residual.scatter_update(tf.IndexedSlices(left, rows))
        positions = tf.gather(rows, local // row_size) * row_size + local % row_size
        return values, positions

    def decompress(self, values, indices, scale=None):
        """Rebuilds the gradients (list shaped like the variables), times `scale` if given."""
        dense = self.compressor.decompress(values, indices, self.size)
        return self.split(dense if scale is None else dense * tf.cast(scale, dense.dtype))

    def split(self, flat):
        """Splits a flat buffer back into tensors shaped like the variables."""
        return [tf.reshape(part, shape) for part, shape in zip(tf.split(flat, self.sizes), self.shapes)]
