"""Local gradient aggregation over several backward passes, free of Keras.

Horovod's ``backward_passes_per_step``: each rank sums its gradients over N
passes in local variables and exchanges the sum once, on the N-th pass
(`horovod/tensorflow/gradient_aggregation*.py` do the same with an allreduce).
"""

import tensorflow as tf

from tfsparse import _validation


class GradientAccumulator(tf.Module):
    """Sums the gradients of `backward_passes_per_step` passes before one exchange.

    The sums and the pass counter are non-trainable variables tracked by this
    module, so a checkpoint taken between two exchanges resumes the
    accumulation exactly. They belong to one rank, like error-feedback
    residuals, and are not optimizer variables (Horovod's broadcast leaves
    them alone).

    Args:
        backward_passes_per_step: passes summed before each exchange, >= 1.
        average_aggregated_gradients: divide the sum by
            `backward_passes_per_step` (Horovod's option of the same name).
        sparse_as_dense: accept ``tf.IndexedSlices`` gradients, summed into
            the dense sums; without it they raise, as in Horovod.
        name: module name.

    Example:
        >>> import tensorflow as tf
        >>> weights = tf.Variable(tf.zeros([2]))
        >>> accumulator = GradientAccumulator(2)
        >>> accumulator.build([weights])
        >>> bool(accumulator.add([tf.constant([1.0, 2.0])]))
        False
        >>> bool(accumulator.add([tf.constant([3.0, 4.0])]))
        True
        >>> accumulator.read([weights.value()])[0].numpy().tolist()
        [4.0, 6.0]
    """

    def __init__(self, backward_passes_per_step, average_aggregated_gradients=False,
                 sparse_as_dense=False, name="gradient_accumulator"):
        super().__init__(name=name)
        self.passes = _validation.check_positive_int(
            "backward_passes_per_step", backward_passes_per_step)
        self._average = _validation.check_bool(
            "average_aggregated_gradients", average_aggregated_gradients)
        self._sparse_as_dense = _validation.check_bool("sparse_as_dense", sparse_as_dense)
        self.sums = []
        self._variable_names = self._no_dependency([])
        self._variable_refs = self._no_dependency([])
        with self.name_scope:
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="counter")

    def build(self, variables):
        """Creates one zero sum per variable (once; call under ``tf.init_scope``).

        Later calls may name some of those variables (a layer frozen since):
        the others' sums are left out of the passes. A variable without a sum
        is an error (a checkpoint restores the sums in the order of the first
        list, so none is added later).
        """
        if self.sums:
            unknown = [v.name for v in variables if v.ref() not in self._variable_refs]
            if unknown:
                raise ValueError(
                    "backward_passes_per_step sums the gradients of the variables of the "
                    f"first step ({len(self.sums)} variables); it was called with variables "
                    f"it has no sum for: {unknown}. Compile with a new DistributedOptimizer for "
                    "a model with new trainable variables (layers added or unfrozen after "
                    "training began).")
            return
        self._variable_names.extend(v.name for v in variables)
        self._variable_refs.extend(v.ref() for v in variables)
        with self.name_scope:
            # Extending the tracked list lets a checkpoint restored earlier reach them.
            self.sums.extend(
                tf.Variable(tf.zeros(v.shape, v.dtype.base_dtype), trainable=False,
                            name="sum_" + v.name.split(":")[0].replace("/", "_"))
                for v in variables
            )

    def sum_of(self, variable):
        """The sum kept for ``variable``, or None (before the first pass, or not one of its)."""
        if variable.ref() not in self._variable_refs:
            return None
        return self.sums[self._variable_refs.index(variable.ref())]

    def _sums_and_names(self, variables):
        """(sum, name) of each of ``variables`` (None: every sum, in order)."""
        if variables is None:
            return list(zip(self.sums, self._variable_names))
        at = [self._variable_refs.index(v.ref()) for v in variables]
        return [(self.sums[i], self._variable_names[i]) for i in at]

    def add(self, gradients, variables=None):
        """Adds one pass's gradients; returns a bool tensor: this pass completes the sum.

        Args:
            gradients: one per variable (None: nothing to add).
            variables: the variables of ``gradients`` (some of those built);
                None: all of them, in the order given to `build`.
        """
        updates = []
        for gradient, (total, name) in zip(gradients, self._sums_and_names(variables)):
            if gradient is None:
                continue
            if isinstance(gradient, tf.IndexedSlices):
                if not self._sparse_as_dense:
                    raise ValueError(
                        f"The gradient of {name} is a tf.IndexedSlices; summing it over "
                        "backward_passes_per_step > 1 passes needs sparse_as_dense=True "
                        "(as in Horovod)."
                    )
                updates.append(total.scatter_add(gradient))
            else:
                updates.append(total.assign_add(gradient))
        with tf.control_dependencies(updates):
            return tf.equal(self.counter.assign_add(1), self.passes)

    def read(self, gradients, variables=None):
        """The sums (divided by the pass count if averaging); None where `gradients` has None.

        ``variables`` as in `add`.
        """
        scale = 1.0 / self.passes if self._average else None
        return [
            None if gradient is None
            else total.read_value() if scale is None
            else total.read_value() * tf.cast(scale, total.dtype)
            for gradient, (total, _) in zip(gradients, self._sums_and_names(variables))
        ]

    def reset(self):
        """Zeroes the sums and the pass counter (after an exchange)."""
        resets = [total.assign(tf.zeros_like(total)) for total in self.sums]
        resets.append(self.counter.assign(0))
        return tf.group(resets)
