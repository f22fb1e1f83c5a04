"""`DistributedOptimizer`: Horovod's Keras optimizer wrapper, with sparse compressed gradients."""

import warnings

import horovod.tensorflow as hvd
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse import _validation
from tfsparse.compression import NoCompression
from tfsparse.horovod.accumulation import GradientAccumulator
from tfsparse.horovod.exchange import CompressedExchange

_OPTIMIZER_TYPES = (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)


class _CompressedGradientsMixin:
    """Combines the gradients through the compressed exchange before applying them."""

    _tfsparse_settings = None  # set on the class built by DistributedOptimizer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = dict(self._tfsparse_settings)
        passes = settings.pop("backward_passes_per_step")
        average = settings.pop("average_aggregated_gradients")
        self._tfsparse_exchange = CompressedExchange(**settings)
        self._tfsparse_accumulator = None
        if passes > 1:
            self._tfsparse_accumulator = GradientAccumulator(
                passes, average, sparse_as_dense=settings["sparse_as_dense"])
        if isinstance(self, keras.optimizers.legacy.Optimizer):
            # The new optimizers track their attributes for checkpoints; a
            # legacy one does not: the residuals and pass sums would be lost.
            self._track_trackable(self._tfsparse_exchange, name="_tfsparse_exchange")
            if passes > 1:
                self._track_trackable(self._tfsparse_accumulator, name="_tfsparse_accumulator")

    @property
    def compression_stats(self):
        """Dict of float64 variables: the last exchange's statistics and running totals."""
        return self._tfsparse_exchange.stats

    @property
    def compression_exchange(self):
        """The `CompressedExchange` (residuals, compressors, statistics)."""
        return self._tfsparse_exchange

    @property
    def gradient_accumulator(self):
        """The `GradientAccumulator` (None when ``backward_passes_per_step`` is 1)."""
        return self._tfsparse_accumulator

    # A LossScaleOptimizer wrapped around this one (Keras's compile wraps the
    # optimizer in one when the model's policy is mixed_float16) aggregates
    # the gradients through it before judging them, then applies them only
    # where they are finite. Each rank judging its own gradients made some
    # ranks exchange while others skipped: the job died in a collective. So
    # called from outside, the aggregation spreads an overflow on any rank
    # to every rank (all gradients NaN: every rank skips the step and lowers
    # its scale); the exchange itself happens in apply_gradients, which then
    # runs on every rank alike. Called from this optimizer's own apply (the
    # base class aggregates there), it passes through.
    _tfsparse_applying = False

    def aggregate_gradients(self, grads_and_vars):  # the new Keras optimizers' API
        grads_and_vars = super().aggregate_gradients(grads_and_vars)
        return grads_and_vars if self._tfsparse_applying else _overflow_on_any_rank_to_all(
            grads_and_vars)

    def _aggregate_gradients(self, grads_and_vars):  # the legacy optimizers' API
        grads_and_vars = super()._aggregate_gradients(grads_and_vars)
        return grads_and_vars if self._tfsparse_applying else _overflow_on_any_rank_to_all(
            grads_and_vars)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        self._tfsparse_applying = True
        try:
            return self._apply_gradients_through_exchange(grads_and_vars, *args, **kwargs)
        finally:
            self._tfsparse_applying = False

    def _apply_gradients_through_exchange(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        gradients, variables = (list(t) for t in zip(*grads_and_vars))
        accumulator = self._tfsparse_accumulator
        with tf.init_scope():
            self._tfsparse_exchange.build(variables, gradients)
            if accumulator is not None:
                accumulator.build(variables)
                self.iterations  # noqa: B018  (a legacy optimizer creates it on first read)
        if accumulator is None:
            return self._exchange_and_apply(gradients, variables, args, kwargs)
        complete = accumulator.add(gradients, variables)

        def exchange_and_apply():
            applied = self._exchange_and_apply(accumulator.read(gradients, variables), variables,
                                               args, kwargs)
            return self._iterations_after(_after(applied, accumulator.reset))

        def count_the_pass():
            # As Horovod: passes that apply nothing still advance `iterations`.
            return tf.identity(self.iterations.assign_add(1))

        applied = tf.cond(complete, exchange_and_apply, count_the_pass)
        if isinstance(self, keras.optimizers.legacy.Optimizer):
            # A legacy apply returns an op: a legacy LossScaleOptimizer around
            # this one conds it with its own skip branch's op (a tensor here
            # failed there: int64 against that op's bool).
            return tf.group(applied)
        return applied

    def _exchange_and_apply(self, gradients, variables, args, kwargs):
        if not isinstance(self, keras.mixed_precision.LossScaleOptimizer):
            return self._exchange_then_apply(gradients, variables, args, kwargs)
        # A loss-scaled step whose gradients overflowed on any rank is skipped
        # by every rank alike: the loss scale optimizer is handed NaN
        # gradients (it skips the step and lowers its scale), and nothing is
        # exchanged (the residuals wait). Each rank deciding on its own
        # gradients made the ranks' scales, steps and collectives drift apart.
        overflowed = _overflowed_on_any_rank(gradients)

        def skip():
            nans = [(_nan_like(g), v) for g, v in zip(gradients, variables) if g is not None]
            return self._iterations_after(super(_CompressedGradientsMixin, self).apply_gradients(
                nans, *args, **kwargs))

        def exchange():
            return self._iterations_after(
                self._exchange_then_apply(gradients, variables, args, kwargs))

        return tf.cond(overflowed, skip, exchange)

    def _iterations_after(self, ops):
        """``optimizer.iterations`` read after ``ops`` (what an apply returned):
        the one output of every branch of the conds above."""
        return _after(ops, lambda: tf.identity(self.iterations))

    def _exchange_then_apply(self, gradients, variables, args, kwargs):
        combined = self._tfsparse_exchange.exchange(gradients, variables)
        return super().apply_gradients(list(zip(combined, variables)), *args, **kwargs)


def _after(ops, then):
    """``then()``, its ops made to run after ``ops`` (None entries ignored)."""
    with tf.control_dependencies([d for d in tf.nest.flatten(ops) if d is not None]):
        return then()


def _overflowed_on_any_rank(gradients):
    """A boolean scalar: some gradient holds a NaN or Inf on some rank."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g
              for g in gradients if g is not None]
    local = tf.constant(0.0)
    if values:
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])
        local = tf.where(finite, 0.0, 1.0)
    return hvd.allreduce(local, op=hvd.Sum, name="tfsparse_loss_scale_overflow") > 0


def _overflow_on_any_rank_to_all(grads_and_vars):
    """``grads_and_vars`` with every gradient NaN where some rank's gradients overflowed."""
    grads_and_vars = list(grads_and_vars)
    overflowed = _overflowed_on_any_rank([g for g, _ in grads_and_vars])

    def spread(gradient):
        if gradient is None:
            return None
        nan = _nan_like(gradient)
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(tf.where(overflowed, nan.values, gradient.values),
                                    gradient.indices, gradient.dense_shape)
        return tf.where(overflowed, nan, gradient)

    return [(spread(g), v) for g, v in grads_and_vars]


def _nan_like(gradient):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * float("nan"), gradient.indices,
                                gradient.dense_shape)
    return tf.fill(tf.shape(gradient), tf.constant(float("nan"), gradient.dtype))


def DistributedOptimizer(optimizer, compression=None, *, op=hvd.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         sparse_as_dense=False, fused=False, nonfinite="raise", compressor=None):
    """Wraps a Keras optimizer so that gradients are compressed and combined over Horovod.

    The arguments shared with ``horovod.tensorflow.keras.DistributedOptimizer``
    (`compression`, `op`, `backward_passes_per_step`,
    `average_aggregated_gradients`, `sparse_as_dense`) mean what they mean
    there, with the same defaults: without `compression` the gradients take a
    dense ``hvd.allreduce`` average, as in Horovod. Horovod's other arguments
    (devices, ``gradient_predivide_factor``, groups, process sets,
    ``scale_local_gradients``) are not offered.

    With a sparsifying `compression` (`SIDCo`, `TopK`, `DGC`, `RandomK`),
    every exchange each rank adds its error-feedback residual to its
    gradient, compresses it, allgathers the values and int32 indices with
    ``hvd.allgather`` (the count may differ per rank), scatter-adds all
    payloads and, for ``op=hvd.Average``, divides by ``hvd.size()``, then
    applies the result with the wrapped optimizer's update rule. What was not
    sent stays in per-variable residuals, non-trainable variables saved with
    TensorFlow checkpoints of the optimizer (they are kept out of
    ``optimizer.variables``, so Horovod's `BroadcastGlobalVariablesCallback`
    leaves each rank's residual alone; save one checkpoint per rank to resume
    error feedback exactly).

    ``tf.IndexedSlices`` gradients (embedding lookups) stay row-sparse unless
    `sparse_as_dense`: without compression their rows and values are
    allgathered (Horovod's ``hvd.allreduce`` of IndexedSlices); with a
    compressor, the rows a gradient touches are summed per distinct row, their
    residual rows added, and the compressor selects among the elements of
    those rows; each selected element travels as its value and int32 position
    in the variable, and the optimizer receives the ``tf.IndexedSlices`` of
    every row any rank sent. An untouched row's residual waits until a later
    gradient touches that row.

    With ``backward_passes_per_step=N > 1`` each rank sums its gradients over
    N passes in local variables (saved with checkpoints, like the residuals)
    and the N-th pass exchanges the sum and applies it, as Horovod does; the
    other passes apply nothing but advance ``optimizer.iterations``.

    Non-finite gradients: ``nonfinite="raise"`` stops with an error naming
    the variable; ``nonfinite="skip"`` checks each variable's gradient on its
    own: a rank whose gradient for a variable holds a NaN or Inf (with
    compression: or overflows to Inf when its residual is added) sends nothing
    for that variable at this exchange (its residual is kept), while its other
    variables and the other ranks' contributions are exchanged as usual (the
    average still divides by ``hvd.size()``). Which gradients are non-finite
    is the model's doing: a NaN in the input reaches every variable that
    depends on it (how far depends on the activations, e.g. ReLU maps NaN to
    0 on some CPUs and keeps it on others), so a bad batch may skip them all.
    A skipped variable can still move through the optimizer's state (momentum).

    Mixed precision (``"mixed_float16"``): wrap the loss scale optimizer,
    ``DistributedOptimizer(keras.mixed_precision.LossScaleOptimizer(opt))``.
    A step whose gradients hold a NaN or Inf on any rank (one ``hvd.allreduce``
    of a flag per step) is then skipped by every rank alike: nothing is
    exchanged (the residuals wait) and the loss scale falls on every rank,
    as with Horovod's own optimizer. The other nesting,
    ``LossScaleOptimizer(DistributedOptimizer(opt))``, which Keras's
    ``compile`` makes by itself when the model's policy is mixed_float16,
    works the same way: the loss scale optimizer aggregates the gradients
    through this one before judging them, and an overflow on any rank makes
    every rank's gradients NaN there (every rank skips the step); the
    exchange then runs when the step is applied.

    Like Horovod, the result is an instance of a class with the wrapped
    optimizer's name, built from its config, so saved models load without
    tfsparse. Statistics of the last exchange (achieved ratio, estimation
    quality, stages, compression time, bytes sent and what a dense allreduce
    would move) are in ``optimizer.compression_stats``, read by
    ``callbacks.CompressionMonitor``.

    Args:
        optimizer: a tf_keras optimizer (`keras.optimizers.Optimizer` or a legacy one).
        compression: a `tfsparse.compression.Compressor` (each gradient buffer
            gets its own clone), or ``hvd.Compression.none``; defaults to
            `NoCompression` (a dense allreduce, as in Horovod).
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        backward_passes_per_step: passes whose gradients are summed locally
            before one exchange.
        average_aggregated_gradients: divide that sum by
            `backward_passes_per_step`.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before the exchange.
        fused: compress all dense gradients (per dtype) as one flat buffer
            instead of per tensor: one estimate and two allgathers per step.
        nonfinite: "raise" or "skip" (see above).
        compressor: deprecated name of `compression`.

    Returns:
        The wrapped optimizer.

    Example:
        >>> import horovod.tensorflow.keras as hvd
        >>> from tfsparse import keras
        >>> from tfsparse.compression import SIDCo
        >>> hvd.init()
        >>> optimizer = DistributedOptimizer(keras.optimizers.SGD(0.1), compression=SIDCo(0.01))
        >>> model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
        >>> model.compile(optimizer=optimizer, loss="mse")
    """
    if not isinstance(optimizer, _OPTIMIZER_TYPES):
        raise _validation.invalid_value(
            "optimizer", "a tf_keras optimizer (from tfsparse import keras)", optimizer
        )
    if isinstance(optimizer, _CompressedGradientsMixin):
        raise _validation.invalid_value(
            "optimizer", "an optimizer not wrapped already", optimizer
        )
    compression = _compression_argument(compression, compressor)
    settings = dict(compression=compression, fused=fused, nonfinite=nonfinite, op=op,
                    sparse_as_dense=sparse_as_dense)
    CompressedExchange(**settings)  # validates the settings now, with Keras-style messages
    GradientAccumulator(backward_passes_per_step, average_aggregated_gradients)
    settings.update(backward_passes_per_step=backward_passes_per_step,
                    average_aggregated_gradients=average_aggregated_gradients)
    base = type(optimizer)
    cls = type(
        base.__name__,
        (_CompressedGradientsMixin, base),
        {"_tfsparse_settings": settings, "__module__": base.__module__},
    )
    return cls.from_config(optimizer.get_config())


def _compression_argument(compression, compressor):
    """`compression`, or the deprecated `compressor`; Horovod's ``Compression.none`` is `NoCompression`."""
    if compressor is not None:
        if compression is not None:
            raise ValueError(
                'Received both "compression" and its deprecated alias "compressor"; pass '
                f"compression only. Received: compression={compression!r}, compressor={compressor!r}"
            )
        warnings.warn(
            'DistributedOptimizer\'s "compressor" argument is deprecated; pass '
            '"compression" (Horovod\'s name) instead.', DeprecationWarning, stacklevel=3)
        compression = compressor
    if compression is None or compression is hvd.Compression.none:
        return NoCompression()
    return compression
