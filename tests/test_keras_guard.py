"""Importing tfsparse selects Keras 2, or explains why it cannot."""

import os
import subprocess
import sys


def _run(code, **env):
    environment = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    environment.update(env, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", code], env=environment,
                          capture_output=True, text=True, timeout=300)


def test_import_makes_tf_keras_the_keras_in_use():
    result = _run("import tfsparse, tensorflow as tf, tf_keras\n"
                  "assert tf.keras.layers.Dense is tf_keras.layers.Dense\n"
                  "assert tfsparse.keras is tf_keras\nprint('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_importing_tensorflow_first_is_fine():
    # TensorFlow loads parts of Keras 3 at import; tf.keras is not resolved yet.
    result = _run("import tensorflow as tf\nimport tfsparse, tf_keras\n"
                  "assert tf.keras.Model is tf_keras.Model\nprint('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_tf_keras_already_used_as_keras_3_gives_an_error_that_says_what_to_do():
    result = _run("import tensorflow as tf\ntf.keras.layers.Dense\nimport tfsparse")
    assert result.returncode != 0
    assert ("ImportError: tfsparse needs Keras 2 (tf_keras), but Keras 3.15.1 is "
            "already loaded in this process as tf.keras.") in result.stderr
    assert "Import tfsparse before using tf.keras" in result.stderr


def test_explicitly_disabled_legacy_keras_is_an_error():
    result = _run("import tfsparse", TF_USE_LEGACY_KERAS="0")
    assert result.returncode != 0
    assert "TF_USE_LEGACY_KERAS='0'" in result.stderr
