"""The compressed gradient exchange, free of Keras: compress, allgather, combine.

`CompressedExchange` holds the per-variable state (one `ErrorFeedback` per
variable, or one per dtype when fused) and the statistics of the last step;
`tfsparse.horovod.DistributedOptimizer` binds it to a Keras optimizer.
Horovod's ``Compression`` hook cannot carry sparse payloads (it feeds an
element-wise allreduce that needs equal shapes), so the values and indices go
through ``hvd.allgather``, which accepts a different length on every rank.

Example:
  >>> import horovod.tensorflow as hvd
  >>> import tensorflow as tf
  >>> from tfsparse.compression import TopK
  >>> hvd.init()
  >>> weights = tf.Variable(tf.zeros([4]))
  >>> exchange = CompressedExchange(TopK(0.5))
  >>> exchange.build([weights])
  >>> [averaged] = exchange.exchange([tf.constant([0.1, -3.0, 0.2, 2.0])], [weights])
  >>> averaged.numpy().tolist()  # one rank: the two largest; the rest waits in the residual
  [0.0, -3.0, 0.0, 2.0]
"""

import horovod.tensorflow as hvd
import tensorflow as tf

from tfsparse.compression import ErrorFeedback
from tfsparse import _validation
from tfsparse.compression.base import Compressor
from tfsparse.horovod.payloads import count
from tfsparse.horovod.payloads import dense_payload_bytes
from tfsparse.horovod.payloads import payload_bytes
from tfsparse.horovod.payloads import slices_from_payload

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
    """Averages (or sums) gradients over Horovod ranks through a compressor.

    Each rank adds its residual to its gradient, compresses, allgathers the
    values and int32 indices, scatter-adds every rank's payload and, for
    ``op=hvd.Average``, divides by the number of ranks. A compressor with
    ``sends_dense = True`` (`NoCompression`) takes ``hvd.allreduce`` instead,
    as ``hvd.DistributedOptimizer`` does.

    A ``tf.IndexedSlices`` gradient (an embedding lookup's) stays row-sparse,
    as in Horovod with ``sparse_as_dense=False``: with `NoCompression` its
    rows and values are allgathered by ``hvd.allreduce``; with a compressor,
    the compressor selects among the elements of the rows it touches (see
    `ErrorFeedback.compress_slices`), and the result is a ``tf.IndexedSlices``
    of the rows any rank sent. Such a variable is never fused with others.

    Args:
        compression: the template `Compressor`; each buffer gets its own clone
            (own adaptive state).
        fused: compress all dense gradients of one dtype as one flat buffer
            instead of one tensor at a time.
        nonfinite: "raise" (error naming the variable) or "skip" (this rank
            sends nothing for that variable this step).
        op: ``hvd.Average`` or ``hvd.Sum``: how the ranks' gradients combine.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients first.
        name: module name.
    """

    def __init__(self, compression, fused=False, nonfinite="raise", op=hvd.Average,
                 sparse_as_dense=False, name="compressed_exchange"):
        super().__init__(name=name)
        if not isinstance(compression, Compressor):
            raise _validation.invalid_value(
                "compression", "a tfsparse.compression.Compressor", compression
            )
        self._template_config = (type(compression), compression.get_config())
        self.sends_dense = compression.sends_dense
        self._fused = _validation.check_bool("fused", fused)
        self._nonfinite = _validation.check_choice(
            "nonfinite", nonfinite, ("raise", "skip")
        )
        self.op = check_reduce_op(op)
        self._sparse_as_dense = _validation.check_bool("sparse_as_dense", sparse_as_dense)
        self.feedbacks = []
        # Every residual again, in the variables' order: checkpoints reach
        # them by this list whatever the buffers (fused or not).
        self.residuals = []
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

    def build(self, variables, gradients=None):
        """Creates the residuals and compressor state for `variables` (once).

        Args:
            variables: the variables whose gradients will be exchanged.
            gradients: optional matching gradients; a variable whose gradient
                is a ``tf.IndexedSlices`` (and ``sparse_as_dense=False``) gets
                a buffer of its own even when fused.
        """
        keys = [v.ref() for v in variables]
        if self._built_keys is not None:
            self._check_variables(variables)
            return
        self._built_keys = self._no_dependency(keys)
        if self.sends_dense:
            return
        row_sparse = [self._is_row_sparse(g) for g in gradients or [None] * len(variables)]
        groups = [[i] for i in range(len(variables)) if row_sparse[i] or not self._fused]
        if self._fused:
            by_dtype = {}
            for index, variable in enumerate(variables):
                if not row_sparse[index]:
                    by_dtype.setdefault(variable.dtype.base_dtype, []).append(index)
            groups.extend(by_dtype.values())
        feedbacks = [
            ErrorFeedback(
                self._new_compressor(), [variables[i] for i in group], nonfinite=self._nonfinite
            )
            for group in groups
        ]
        self._groups.extend(groups)
        # Extending the tracked lists (not replacing them) lets a checkpoint
        # restored before the first step reach the new residuals now.
        self.feedbacks.extend(feedbacks)
        self.residuals.extend(self.residual_of(variable) for variable in variables)

    def _check_variables(self, variables):
        """Later steps may train some of the first step's variables, not others.

        Freezing a layer and compiling again with the same optimizer leaves
        its variables out: their residuals wait (checkpoints keep them) until
        they train again. A dense exchange keeps no state: any list goes.
        """
        if self.sends_dense:
            return
        built = self._built_keys
        unknown = [v.name for v in variables if v.ref() not in built]
        if unknown:
            raise ValueError(
                "The compressed exchange keeps error-feedback residuals for the variables of "
                f"its first step ({len(built)} variables); it was called with variables it "
                f"has none for: {unknown}. Compile with a new DistributedOptimizer for a model "
                "with new trainable variables (layers added or unfrozen after training began; "
                "its residuals start at zero).")
        if self._fused:
            called = {v.ref() for v in variables}
            for group in self._groups:
                present = [built[i] in called for i in group]
                if any(present) and not all(present):
                    left_out = [built[i].deref().name for i in group if built[i] not in called]
                    raise ValueError(
                        "fused=True compresses the gradients of each dtype as one buffer, "
                        "residuals included; a step without some of its variables (a frozen "
                        "layer's) would send their residuals and drop what it sent. Use "
                        f"fused=False to freeze layers during training. Left out: {left_out}")

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

    def _is_row_sparse(self, gradient):
        return isinstance(gradient, tf.IndexedSlices) and not self._sparse_as_dense

    def _prepare(self, gradient):
        if gradient is None or self._is_row_sparse(gradient):
            return gradient
        return tf.convert_to_tensor(gradient)

    def exchange(self, gradients, variables):
        """Returns the gradients combined over all ranks (``op``).

        A None gradient stays None, except inside a fused buffer, where it
        counts as zeros (its residual may still send something).

        Args:
            gradients: list of gradient tensors (or None / IndexedSlices).
            variables: the matching variables: the list given to `build`, or
                some of them (the others, frozen, keep their residuals).
        """
        gradients = [self._prepare(g) for g in gradients]
        if self.sends_dense:
            return self._dense_exchange(gradients, variables)
        keys = self._built_keys
        if [v.ref() for v in variables] != keys:
            # Some of the built variables (the others frozen): theirs stay
            # None (their buffers idle, their residuals kept).
            positions = [keys.index(v.ref()) for v in variables]
            every = [None] * len(keys)
            for position, gradient in zip(positions, gradients):
                every[position] = gradient
            combined = self._sparse_exchange(every, [key.deref() for key in keys])
            return [combined[position] for position in positions]
        return self._sparse_exchange(gradients, variables)

    def _sparse_exchange(self, gradients, variables):
        """The exchange of `exchange`, for the built list of variables."""
        active = [
            (number, group, feedback)
            for number, (group, feedback) in enumerate(zip(self._groups, self.feedbacks))
            if any(gradients[i] is not None for i in group)
        ]
        with tf.control_dependencies(_tensors(gradients)):
            start = tf.timestamp()
        payloads, candidates = [], []
        with tf.control_dependencies([start]):
            for _, group, feedback in active:
                payload, chosen_from = self._compress(feedback, [gradients[i] for i in group],
                                                [variables[i] for i in group])
                payloads.append(payload)
                candidates.append(chosen_from)
        with tf.control_dependencies([t for payload in payloads for t in payload]):
            compressed = tf.timestamp()
        combined = [None] * len(gradients)
        gathered_bytes = []
        world = hvd.size()
        scale = 1.0 / world if self.op == hvd.Average else 1.0
        with tf.control_dependencies([compressed]):
            for (number, group, feedback), (values, indices) in zip(active, payloads):
                if world > 1:
                    values = hvd.allgather(values, name=f"tfsparse_values_{number}")
                    indices = hvd.allgather(indices, name=f"tfsparse_indices_{number}")
                gathered_bytes.append(payload_bytes(values, indices))
                if isinstance(gradients[group[0]], tf.IndexedSlices):
                    combined[group[0]] = slices_from_payload(
                        values * scale, indices, variables[group[0]].shape)
                else:
                    for i, dense in zip(group, feedback.decompress(values, indices, scale)):
                        combined[i] = dense
        with tf.control_dependencies(_tensors(combined)):
            finished = tf.timestamp()
        if active:
            self._record([f for _, _, f in active], payloads, candidates, gathered_bytes,
                         (start, compressed, finished))
        return combined

    def _compress(self, feedback, gradients, variables):
        """One buffer's payload and the number of elements its compressor chose from."""
        row_sparse = [isinstance(g, tf.IndexedSlices) for g in gradients]
        if any(row_sparse):
            if len(gradients) > 1:
                raise ValueError(
                    f"The gradient of {variables[row_sparse.index(True)].name} is a "
                    "tf.IndexedSlices, but the exchange was built with a dense gradient for it "
                    "in a fused buffer. Build the exchange with the gradients it will receive, "
                    "or pass sparse_as_dense=True."
                )
            slices = gradients[0]
            rows = tf.size(tf.unique(slices.indices).y, out_type=tf.int64)
            row_size = variables[0].shape[1:].num_elements()
            chosen_from = tf.cast(rows * row_size, tf.float64)  # the distinct rows' elements
            return feedback.compress_slices(slices), chosen_from
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]
        return feedback.compress(gradients), tf.constant(float(feedback.size), tf.float64)

    def _dense_exchange(self, gradients, variables):
        with tf.control_dependencies(_tensors(gradients)):
            start = tf.timestamp()
        combined = [
            None if gradient is None else self._allreduce(self._checked(gradient, variable))
            for gradient, variable in zip(gradients, variables)
        ]
        with tf.control_dependencies(_tensors(combined)):
            finished = tf.timestamp()
        present = [(g, v) for g, v in zip(gradients, variables) if g is not None]
        elements = _total([count(_values(g)) for g, _ in present])
        sent = _total([dense_payload_bytes(g) for g, _ in present])
        # An allreduce takes a whole tensor from every rank; an allgather what it returns.
        gathered = _total([
            dense_payload_bytes(out) if isinstance(out, tf.IndexedSlices)
            else dense_payload_bytes(g) * hvd.size()
            for g, out in zip(gradients, combined) if g is not None
        ])
        dense_bytes = float(sum(v.shape.num_elements() * v.dtype.size for _, v in present))
        self._assign(
            elements=elements, selected=elements, target=elements,
            stages=tf.constant(0.0, tf.float64), compression_time=tf.constant(0.0, tf.float64),
            exchange_time=finished - start, bytes_sent=sent, bytes_gathered=gathered,
            dense_bytes=tf.constant(dense_bytes, tf.float64),
        )
        return combined

    def _checked(self, gradient, variable):
        """The gradient, or an error / zeros (nonfinite policy) when it is not finite."""
        values = _values(gradient)
        if self._nonfinite == "raise":
            values = tf.debugging.check_numerics(
                values, f"Non-finite gradient (NaN or Inf) for variable {variable.name}"
            )
        else:
            finite = tf.reduce_all(tf.math.is_finite(values))
            values = tf.where(finite, values, tf.zeros_like(values))
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
        return values

    def _allreduce(self, gradient):
        if hvd.size() == 1:
            return gradient
        return hvd.allreduce(gradient, op=self.op)

    def _record(self, feedbacks, payloads, candidates, gathered_bytes, times):
        start, compressed, finished = times
        selected = tf.add_n([count(v) for v, _ in payloads])
        target = tf.add_n([
            tf.cast(f.compressor.target_count(candidate), tf.float64)
            for f, candidate in zip(feedbacks, candidates)
        ])
        staged = [tf.cast(f.compressor.stages, tf.float64) for f in feedbacks
                  if hasattr(f.compressor, "stages")]
        stages = tf.add_n(staged) / len(staged) if staged else tf.constant(0.0, tf.float64)
        dense_bytes = float(sum(f.size * f.dtype.size for f in feedbacks))
        self._assign(
            elements=tf.add_n(candidates), selected=selected, target=target,
            stages=stages, compression_time=compressed - start, exchange_time=finished - compressed,
            bytes_sent=tf.add_n([payload_bytes(v, i) for v, i in payloads]),
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



_OP_NAMES = {hvd.Average: "hvd.Average", hvd.Sum: "hvd.Sum", hvd.Adasum: "hvd.Adasum",
             hvd.Min: "hvd.Min", hvd.Max: "hvd.Max", hvd.Product: "hvd.Product"}


def check_reduce_op(op):
    """Checks that `op` is ``hvd.Average`` or ``hvd.Sum`` and returns it."""
    is_op = isinstance(op, int) and not isinstance(op, bool)
    if is_op and op in (hvd.Average, hvd.Sum):
        return op
    expected = "hvd.Average or hvd.Sum"
    if is_op and op == hvd.Adasum:
        expected += (" (Adasum combines whole dense gradients by their dot products, which "
                     "sparse payloads and error feedback do not preserve; use Horovod's "
                     "hvd.DistributedOptimizer(op=hvd.Adasum) for it)")
    received = _OP_NAMES.get(op, repr(op)) if is_op else repr(op)
    raise _validation.invalid_value("op", expected, received=f"op={received}")


def _total(counts):
    return tf.add_n(counts) if counts else tf.constant(0.0, tf.float64)


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _tensors(gradients):
    """The tensors behind a list of gradients (IndexedSlices give their values)."""
    return [_values(g) for g in gradients if g is not None]
