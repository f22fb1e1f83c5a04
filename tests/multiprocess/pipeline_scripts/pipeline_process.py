"""The set-up every pipeline script started by horovodrun shares; import it first.

Two logical CPU devices (configured before TensorFlow initialises its
devices) with one intra-op thread each, tfsparse imported before Horovod (it
selects tf_keras, which Horovod's Keras then uses), then Horovod.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.config.threading.set_intra_op_parallelism_threads(1)

import tfsparse  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.distribute import PipelineStrategy  # noqa: E402

__all__ = ["PipelineStrategy", "compiled", "hvd", "keras", "tf", "tfsparse"]


def compiled(strategy, network, optimizer, window):
    """``network()`` compiled for 3-class logits with accuracy, ``optimizer()``
    and ``steps_per_execution=window``, attached to ``strategy`` unless None."""
    model = network()
    model.compile(optimizer(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=window)
    return model if strategy is None else strategy.attach(model)
