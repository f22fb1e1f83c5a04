"""Serve a SavedModel or a TFLite file with plain TensorFlow, without tfsparse.

    python examples/serve_saved_model.py SAVED_MODEL_DIR|MODEL.tflite --inputs X.npy
        [--labels Y.npy]

Loads the model with ``tf.saved_model.load``, or a ``.tflite`` file (written
by ``tfsparse.export.to_tflite``) with ``tf.lite.Interpreter`` (no tfsparse,
no Keras needed: the exported graphs hold core TensorFlow ops, the TFLite
file TFLite builtin ops only), predicts the given inputs, and prints the
predictions.
"""

import argparse
import os
import sys

sys.modules["tfsparse"] = None  # prove that serving does not need tfsparse
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def predict_saved_model(path, x):
    serve = tf.saved_model.load(path).signatures["serving_default"]
    (input_name,) = serve.structured_input_signature[1]
    (probabilities,) = serve(**{input_name: tf.constant(x)}).values()
    return probabilities.numpy()


def predict_tflite(path, x):
    interpreter = tf.lite.Interpreter(model_path=path)
    (inputs,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(inputs["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inputs["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a SavedModel directory or a .tflite file")
    parser.add_argument("--inputs", required=True, help=".npy file of input rows")
    parser.add_argument("--labels", help=".npy file of the true labels")
    args = parser.parse_args()
    x = np.load(args.inputs)
    if args.model.endswith(".tflite"):
        probabilities = predict_tflite(args.model, x)
    else:
        probabilities = predict_saved_model(args.model, x)
    predictions = probabilities.argmax(axis=1)
    print(f"served {len(x)} inputs from {args.model} without tfsparse")
    print("predictions:", predictions.tolist())
    if args.labels:
        labels = np.load(args.labels)
        print("labels:     ", labels.tolist())
        print(f"correct: {(predictions == labels).sum()} of {len(labels)}")


if __name__ == "__main__":
    main()
