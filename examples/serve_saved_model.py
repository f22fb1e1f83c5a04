"""Serve a SavedModel with plain TensorFlow, in a process where tfsparse is absent.

    python examples/serve_saved_model.py SAVED_MODEL_DIR [--samples 10]

Loads the model with ``tf.saved_model.load`` (no tfsparse, no Keras needed:
the exported graph holds core TensorFlow ops only), predicts the first
samples of the shipped MNIST test split, and prints the predictions.
"""

import argparse
import os
import sys

sys.modules["tfsparse"] = None  # prove that serving does not need tfsparse
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("saved_model")
    parser.add_argument("--inputs", required=True, help=".npy file of input rows")
    parser.add_argument("--labels", help=".npy file of the true labels")
    args = parser.parse_args()
    model = tf.saved_model.load(args.saved_model)
    serve = model.signatures["serving_default"]
    (input_name,) = serve.structured_input_signature[1]
    x = np.load(args.inputs)
    (probabilities,) = serve(**{input_name: tf.constant(x)}).values()
    predictions = probabilities.numpy().argmax(axis=1)
    print(f"served {len(x)} inputs from {args.saved_model} without tfsparse")
    print("predictions:", predictions.tolist())
    if args.labels:
        labels = np.load(args.labels)
        print("labels:     ", labels.tolist())
        print(f"correct: {(predictions == labels).sum()} of {len(labels)}")


if __name__ == "__main__":
    main()
