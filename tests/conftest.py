"""Shared pytest set-up: quiet TensorFlow, CPU only, Keras 2 before anything."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tfsparse  # noqa: E402,F401  (selects tf_keras before any test imports Keras)
