"""The one place that picks the Keras implementation tfsparse uses.

tfsparse is built on Keras 2 (the ``tf_keras`` package), because both
tensorflow-model-optimization and Horovod's Keras API need it. Every module of
tfsparse imports ``keras`` from here, never ``tf.keras`` or ``keras`` directly.

Importing this module sets ``TF_USE_LEGACY_KERAS=1`` so that ``tf.keras`` is
``tf_keras`` too. If Keras 3 was already imported in this process, tfsparse
layers could not be mixed with the user's Keras objects, so it raises an
``ImportError`` that says how to fix the import order instead.
"""

import os
import sys

_FALSE_VALUES = ("0", "false", "no", "off")


def _select_keras_2():
    setting = os.environ.get("TF_USE_LEGACY_KERAS")
    if setting is not None and setting.strip().lower() in _FALSE_VALUES:
        raise ImportError(
            "tfsparse needs Keras 2 (the tf_keras package), but the environment "
            f"sets TF_USE_LEGACY_KERAS={setting!r}. Unset it or set "
            "TF_USE_LEGACY_KERAS=1 before starting Python."
        )
    keras_module = sys.modules.get("keras")
    version = getattr(keras_module, "__version__", "") if keras_module else ""
    if version.startswith("3"):
        raise ImportError(
            f"tfsparse needs Keras 2 (tf_keras), but Keras {version} is already "
            "loaded in this process. Import tfsparse before keras or "
            "tf.keras, or set TF_USE_LEGACY_KERAS=1 in the environment before "
            "starting Python; then build your models with tf.keras (which is "
            "tf_keras) or `from tfsparse import keras`."
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


_select_keras_2()

import tf_keras as keras  # noqa: E402  (must follow the environment set-up)

__all__ = ["keras"]
