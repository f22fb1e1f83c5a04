"""`DistributedOptimizer`: a Keras optimizer whose gradients travel compressed."""

import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.compression import SIDCo
from tfsparse import _validation
from tfsparse.horovod.exchange import CompressedExchange

_OPTIMIZER_TYPES = (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)


class _CompressedGradientsMixin:
    """Averages the gradients through the compressed exchange before applying them."""

    _tfsparse_settings = None  # set on the class built by DistributedOptimizer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tfsparse_exchange = CompressedExchange(**self._tfsparse_settings)

    @property
    def compression_stats(self):
        """Dict of float64 variables: the last step's statistics and running totals."""
        return self._tfsparse_exchange.stats

    @property
    def compression_exchange(self):
        """The `CompressedExchange` (residuals, compressors, statistics)."""
        return self._tfsparse_exchange

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        gradients, variables = zip(*grads_and_vars)
        exchange = self._tfsparse_exchange
        with tf.init_scope():
            exchange.build(list(variables))
        averaged = exchange.exchange(list(gradients), list(variables))
        return super().apply_gradients(list(zip(averaged, variables)), *args, **kwargs)


def DistributedOptimizer(optimizer, compressor=None, fused=False, nonfinite="raise"):
    """Wraps a Keras optimizer so that gradients are compressed and averaged over Horovod.

    On every step each rank adds its error-feedback residual to its gradient,
    compresses it (`compressor`), allgathers the values and int32 indices with
    ``hvd.allgather`` (the count may differ per rank), scatter-adds all
    payloads, divides by ``hvd.size()`` and applies the result with the wrapped
    optimizer's update rule. What was not sent stays in per-variable residuals,
    non-trainable variables saved with TensorFlow checkpoints of the optimizer
    (they are kept out of ``optimizer.variables``, so Horovod's
    `BroadcastGlobalVariablesCallback` leaves each rank's residual alone;
    save one checkpoint per rank to resume error feedback exactly). With
    `NoCompression` the gradients take a dense ``hvd.allreduce`` average, as
    in ``hvd.DistributedOptimizer``.

    Like Horovod, the result is an instance of a class with the wrapped
    optimizer's name, built from its config, so saved models load without
    tfsparse. Statistics of the last step (achieved ratio, estimation
    quality, stages, compression time, bytes sent and what a dense allreduce
    would move) are in ``optimizer.compression_stats``, read by
    ``callbacks.CompressionMonitor``.

    Args:
        optimizer: a tf_keras optimizer (`keras.optimizers.Optimizer` or a legacy one).
        compressor: a `tfsparse.compression.Compressor`; defaults to
            ``SIDCo(0.01)``. Each gradient buffer gets its own clone.
        fused: compress all gradients (per dtype) as one flat buffer instead of
            per tensor: one estimate and two allgathers per step.
        nonfinite: "raise" (an error naming the variable) or "skip" (a
            non-finite gradient sends nothing this step, its residual is kept).

    Returns:
        The wrapped optimizer.

    Example:
        >>> import horovod.tensorflow.keras as hvd
        >>> from tfsparse import keras
        >>> from tfsparse.compression import SIDCo
        >>> hvd.init()
        >>> optimizer = DistributedOptimizer(keras.optimizers.SGD(0.1), SIDCo(0.01))
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
    if compressor is None:
        compressor = SIDCo(0.01)
    settings = dict(compressor=compressor, fused=fused, nonfinite=nonfinite)
    CompressedExchange(**settings)  # validates the settings now, with Keras-style messages
    base = type(optimizer)
    cls = type(
        base.__name__,
        (_CompressedGradientsMixin, base),
        {"_tfsparse_settings": settings, "__module__": base.__module__},
    )
    return cls.from_config(optimizer.get_config())

