"""Horovod's `MetricAverageCallback`, handed the Keras 2 backend it needs."""

import horovod.tensorflow.keras as hvd_keras

from tfsparse._framework_internal import set_horovod_callback_backend
from tfsparse._keras import keras


class MetricAverageCallback(hvd_keras.callbacks.MetricAverageCallback):
    """Averages the epoch logs over all Horovod ranks.

    Horovod 0.28.1 builds its Keras callbacks with ``from keras import
    backend`` (TF >= 2.6), which is Keras 3 whenever Keras 3 is installed, as
    it is next to TensorFlow 2.21; Keras 3's backend has no ``constant``, so
    ``hvd.callbacks.MetricAverageCallback`` fails at the first epoch end. This
    subclass changes nothing but the backend object it is given: tf_keras's.

    Args:
        device: device for the allreduce, as in Horovod.

    Example:
        >>> callback = MetricAverageCallback()
    """

    def __init__(self, device=""):
        super().__init__(device)
        set_horovod_callback_backend(self, keras.backend)
