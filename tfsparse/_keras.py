"""The one place that picks the Keras implementation tfsparse uses.

tfsparse is built on Keras 2 (the ``tf_keras`` package), because both
tensorflow-model-optimization and Horovod's Keras API need it. Every module of
tfsparse imports ``keras`` from here, never ``tf.keras`` or ``keras`` directly.

Importing this module sets ``TF_USE_LEGACY_KERAS=1`` so that ``tf.keras`` is
``tf_keras`` too. TensorFlow resolves ``tf.keras`` lazily, on first use, and
cannot switch afterwards: if this process already used ``tf.keras`` as Keras 3,
tfsparse's layers could not be mixed with the user's Keras objects, so this
raises an ``ImportError`` that says how to fix the import order. (``import
tensorflow`` itself loads parts of Keras 3 without using ``tf.keras``; that is
fine.)
"""

import os
import sys

from tfsparse._framework_internal import tf_keras_resolved_to_keras_3

_FALSE_VALUES = ("0", "false", "no", "off")


def _select_keras_2():
    setting = os.environ.get("TF_USE_LEGACY_KERAS")
    if setting is not None and setting.strip().lower() in _FALSE_VALUES:
        raise ImportError(
            "tfsparse needs Keras 2 (the tf_keras package), but the environment "
            f"sets TF_USE_LEGACY_KERAS={setting!r}. Unset it or set "
            "TF_USE_LEGACY_KERAS=1 before starting Python."
        )
    if tf_keras_resolved_to_keras_3(sys.modules.get("tensorflow")):
        version = getattr(sys.modules.get("keras"), "__version__", "3")
        raise ImportError(
            f"tfsparse needs Keras 2 (tf_keras), but Keras {version} is already "
            "loaded in this process as tf.keras. Import tfsparse before using "
            "tf.keras, or set TF_USE_LEGACY_KERAS=1 in the environment before "
            "starting Python; then build your models with tf.keras (which is "
            "tf_keras) or `from tfsparse import keras`."
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


_select_keras_2()

import tf_keras as keras  # noqa: E402  (must follow the environment set-up)

__all__ = ["keras", "serializable", "unwrap_loss_scaling"]


def serializable(cls):
    """Registers ``cls`` for Keras saving as ``tfsparse>Name`` and as ``Name``.

    Keras's own configs name a class ``tfsparse>Name``; some of tf_keras's
    paths look a class up by its bare name (the layer inside a
    ``TimeDistributed`` or ``Bidirectional`` wrapper, and regularizers in
    ``.h5`` files), where the package name alone made ``load_model``,
    ``clone_model`` and ``sparsify`` fail with "Unknown layer". The bare name
    is not taken from another class already registered under it.

    Example:
        >>> from tfsparse.layers import SparseDense
        >>> keras.utils.get_custom_objects()["SparseDense"] is SparseDense
        True
    """
    cls = keras.saving.register_keras_serializable(package="tfsparse")(cls)
    keras.utils.get_custom_objects().setdefault(cls.__name__, cls)
    return cls


def unwrap_loss_scaling(optimizer):
    """The optimizer inside any ``LossScaleOptimizer`` around ``optimizer`` (Keras's
    compile puts one around it when the model's policy is ``mixed_float16``).

    Example:
        >>> opt = keras.optimizers.SGD()
        >>> unwrap_loss_scaling(keras.mixed_precision.LossScaleOptimizer(opt)) is opt
        True
    """
    while isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer
