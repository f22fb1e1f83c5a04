"""The compressed gradient exchange, free of Keras: compress, allgather, average.

`CompressedExchange` holds the per-variable state (one `ErrorFeedback` per
variable, or one per dtype when fused) and the statistics of the last step;
`tfsparse.horovod.DistributedOptimizer` binds it to a Keras optimizer.
Horovod's ``Compression`` hook cannot carry sparse payloads (it feeds an
element-wise allreduce that needs equal shapes), so the values and indices go
through ``hvd.allgather``, which accepts a different length on every rank.
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from tfsparse.compression import ErrorFeedback
from tfsparse.compression import _validation
from tfsparse.compression.base import Compressor

INDEX_BYTES = 4

#: Statistics of the last step (float64 scalars), then running totals.
STEP_STATS = (
    "elements",  # gradient elements exchanged
    "selected",  # elements this rank sent
    "target",  # elements the ratio asked for
    "achieved_ratio",  # selected / elements
    "estimation_quality",  # selected / target
    "stages",  # mean stage count of the compressors that have stages (0 if none)
    "compression_time",  # seconds spent compressing (incl. error feedback)
    "exchange_time",  # seconds spent in the collectives and decompression
    "bytes_sent",  # this rank's payload: values + int32 indices
    "bytes_gathered",  # payload bytes gathered from all ranks
    "dense_bytes",  # bytes of the dense gradients a dense allreduce would reduce
)
TOTAL_STATS = (
    "steps",
    "total_elements",
    "total_selected",
    "total_target",
    "total_bytes_sent",
    "total_bytes_gathered",
    "total_dense_bytes",
    "total_compression_time",
)


class CompressedExchange(tf.Module):
    """Averages gradients over Horovod ranks through a compressor.

    Each rank adds its residual to its gradient, compresses, allgathers the
    values and int32 indices, scatter-adds every rank's payload and divides by
    the number of ranks. A compressor with ``sends_dense = True``
    (`NoCompression`) takes a dense ``hvd.allreduce`` (average) instead.

    Args:
        compressor: the template `Compressor`; each buffer gets its own clone
            (own adaptive state).
        fused: compress all gradients of one dtype as one flat buffer instead
            of one tensor at a time.
        nonfinite: "raise" (error naming the variable) or "skip" (that
            gradient sends nothing this step).
        name: module name.
    """

    def __init__(self, compressor, fused=False, nonfinite="raise", name="compressed_exchange"):
        super().__init__(name=name)
        if not isinstance(compressor, Compressor):
            raise _validation.invalid_value(
                "compressor", "a tfsparse.compression.Compressor", compressor
            )
        self._template_config = (type(compressor), compressor.get_config())
        self.sends_dense = compressor.sends_dense
        self._fused = _validation.check_bool("fused", fused)
        self._nonfinite = _validation.check_choice(
            "nonfinite", nonfinite, ("raise", "skip")
        )
        self.feedbacks = []
        self._groups = self._no_dependency([])
        self._built_keys = self._no_dependency(None)
        with self.name_scope:
            self.stats = {
                key: tf.Variable(tf.zeros([], tf.float64), trainable=False, name=key)
                for key in STEP_STATS + TOTAL_STATS
            }

    @property
    def fused(self):
        return self._fused

    def _new_compressor(self):
        cls, config = self._template_config
        return cls.from_config(config)

    def build(self, variables):
        """Creates the residuals and compressor state for `variables` (once)."""
        keys = [v.ref() for v in variables]
        if self._built_keys is not None:
            if keys != self._built_keys:
                raise ValueError(
                    "The compressed exchange was built for a different list of variables "
                    f"({len(self._built_keys)} variables); it was called with {len(keys)}. "
                    "Use one DistributedOptimizer per model."
                )
            return
        self._built_keys = self._no_dependency(keys)
        if self.sends_dense:
            return
        if self._fused:
            by_dtype = {}
            for index, variable in enumerate(variables):
                by_dtype.setdefault(variable.dtype.base_dtype, []).append(index)
            groups = list(by_dtype.values())
        else:
            groups = [[index] for index in range(len(variables))]
        feedbacks = [
            ErrorFeedback(
                self._new_compressor(), [variables[i] for i in group], nonfinite=self._nonfinite
            )
            for group in groups
        ]
        self._groups.extend(groups)
        # Extending the tracked list (not replacing it) lets a checkpoint
        # restored before the first step reach the new residuals now.
        self.feedbacks.extend(feedbacks)

    def residual_of(self, variable):
        """The error-feedback residual of ``variable`` (None if it has none).

        None before the first step, with a dense compressor, or for a
        variable the exchange was not built for.
        """
        keys = self._built_keys or []
        if self.sends_dense or variable.ref() not in keys:
            return None
        index = keys.index(variable.ref())
        for group, feedback in zip(self._groups, self.feedbacks):
            if index in group:
                return feedback.residuals[group.index(index)]
        return None

    def exchange(self, gradients, variables):
        """Returns the gradients averaged over all ranks.

        A None gradient stays None, except inside a fused buffer, where it
        counts as zeros (its residual may still send something).

        Args:
            gradients: list of gradient tensors (or None / IndexedSlices).
            variables: the matching variables (the list given to `build`).
        """
        gradients = [None if g is None else tf.convert_to_tensor(g) for g in gradients]
        if self.sends_dense:
            return self._dense_average(gradients, variables)
        active = [
            (number, group, feedback)
            for number, (group, feedback) in enumerate(zip(self._groups, self.feedbacks))
            if any(gradients[i] is not None for i in group)
        ]
        present = [g for g in gradients if g is not None]
        with tf.control_dependencies(present):
            start = tf.timestamp()
        payloads = []
        with tf.control_dependencies([start]):
            for _, group, feedback in active:
                grads = [
                    tf.zeros_like(variables[i]) if gradients[i] is None else gradients[i]
                    for i in group
                ]
                payloads.append(feedback.compress(grads))
        with tf.control_dependencies([t for payload in payloads for t in payload]):
            compressed = tf.timestamp()
        averaged = [None] * len(gradients)
        gathered_bytes = []
        world = hvd.size()
        with tf.control_dependencies([compressed]):
            for (number, group, feedback), (values, indices) in zip(active, payloads):
                if world > 1:
                    values = hvd.allgather(values, name=f"tfsparse_values_{number}")
                    indices = hvd.allgather(indices, name=f"tfsparse_indices_{number}")
                gathered_bytes.append(_payload_bytes(values, indices))
                for i, dense in zip(group, feedback.decompress(values, indices, 1.0 / world)):
                    averaged[i] = dense
        with tf.control_dependencies([g for g in averaged if g is not None]):
            finished = tf.timestamp()
        if active:
            self._record([f for _, _, f in active], payloads, gathered_bytes, start, compressed, finished)
        return averaged

    def _dense_average(self, gradients, variables):
        present = [g for g in gradients if g is not None]
        with tf.control_dependencies(present):
            start = tf.timestamp()
        averaged = []
        for gradient, variable in zip(gradients, variables):
            if gradient is not None:
                if self._nonfinite == "raise":
                    gradient = tf.debugging.check_numerics(
                        gradient, f"Non-finite gradient (NaN or Inf) for variable {variable.name}"
                    )
                else:
                    finite = tf.reduce_all(tf.math.is_finite(gradient))
                    gradient = tf.where(finite, gradient, tf.zeros_like(gradient))
                if hvd.size() > 1:
                    gradient = hvd.allreduce(gradient, op=hvd.Average)
            averaged.append(gradient)
        with tf.control_dependencies([g for g in averaged if g is not None]):
            finished = tf.timestamp()
        sizes = [(_count(g), g.dtype.size) for g in present]
        elements = tf.add_n([n for n, _ in sizes]) if sizes else tf.constant(0.0, tf.float64)
        dense_bytes = tf.add_n([n * b for n, b in sizes]) if sizes else tf.constant(0.0, tf.float64)
        self._assign(
            elements=elements, selected=elements, target=elements,
            stages=tf.constant(0.0, tf.float64), compression_time=tf.constant(0.0, tf.float64),
            exchange_time=finished - start, bytes_sent=dense_bytes,
            bytes_gathered=dense_bytes * hvd.size(), dense_bytes=dense_bytes,
        )
        return averaged

    def _record(self, feedbacks, payloads, gathered_bytes, start, compressed, finished):
        elements = sum(f.size for f in feedbacks)
        selected = tf.add_n([_count(v) for v, _ in payloads])
        target = tf.add_n([
            tf.cast(f.compressor.target_count(f.size), tf.float64) for f in feedbacks
        ])
        staged = [tf.cast(f.compressor.stages, tf.float64) for f in feedbacks
                  if hasattr(f.compressor, "stages")]
        stages = tf.add_n(staged) / len(staged) if staged else tf.constant(0.0, tf.float64)
        dense_bytes = float(sum(f.size * f.dtype.size for f in feedbacks))
        self._assign(
            elements=tf.constant(float(elements), tf.float64), selected=selected, target=target,
            stages=stages, compression_time=compressed - start, exchange_time=finished - compressed,
            bytes_sent=tf.add_n([_payload_bytes(v, i) for v, i in payloads]),
            bytes_gathered=tf.add_n(gathered_bytes),
            dense_bytes=tf.constant(dense_bytes, tf.float64),
        )

    def _assign(self, **values):
        stats = self.stats
        values["achieved_ratio"] = values["selected"] / tf.maximum(values["elements"], 1.0)
        values["estimation_quality"] = values["selected"] / tf.maximum(values["target"], 1.0)
        for key, value in values.items():
            stats[key].assign(value)
        stats["steps"].assign_add(1.0)
        stats["total_elements"].assign_add(values["elements"])
        stats["total_bytes_sent"].assign_add(values["bytes_sent"])
        stats["total_bytes_gathered"].assign_add(values["bytes_gathered"])
        stats["total_dense_bytes"].assign_add(values["dense_bytes"])
        stats["total_compression_time"].assign_add(values["compression_time"])
        stats["total_selected"].assign_add(values["selected"])
        stats["total_target"].assign_add(values["target"])


def _count(tensor):
    return tf.cast(tf.size(tensor), tf.float64)


def _payload_bytes(values, indices):
    return _count(values) * values.dtype.size + _count(indices) * INDEX_BYTES
