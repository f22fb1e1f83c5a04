"""Serve a SavedModel or a TFLite file with plain TensorFlow, without tfsparse.

    python examples/serve_saved_model.py SAVED_MODEL_DIR|MODEL.tflite --inputs X.npy
        [--labels Y.npy]

Loads the model with ``tf.saved_model.load``, or a ``.tflite`` file (written
by ``tfsparse.export.to_tflite``) with ``tf.lite.Interpreter`` (no tfsparse,
no Keras needed: the exported graphs hold core TensorFlow ops, the TFLite
file TFLite builtin ops only), predicts the given inputs, and prints the
predictions. The inputs are ``[n, ...]``, n examples of the model's input
shape (rows of its width for a dense model, images for a convolutional one);
float64 ones (what ``x / 255`` gives in NumPy) are served as float32.
"""

import argparse
import os
import sys

sys.modules["tfsparse"] = None  # prove that serving does not need tfsparse
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def predict_saved_model(path, x, check_inputs):
    serve = tf.saved_model.load(path).signatures["serving_default"]
    ((input_name, spec),) = serve.structured_input_signature[1].items()
    x = check_inputs(x, tuple(spec.shape[1:]))
    (probabilities,) = serve(**{input_name: tf.constant(x)}).values()
    return probabilities.numpy()


def predict_tflite(path, x, check_inputs):
    interpreter = tf.lite.Interpreter(model_path=path)
    (inputs,) = interpreter.get_input_details()
    x = check_inputs(x, tuple(int(d) for d in inputs["shape"][1:]))
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
    for option, path in (("model", args.model), ("--inputs", args.inputs),
                         ("--labels", args.labels)):
        if path is not None and not os.path.exists(path):
            parser.error(f"{option}: {path} does not exist")
    if not args.model.endswith(".tflite") and not os.path.isdir(args.model):
        parser.error(f"model: expected a SavedModel directory or a .tflite file; received "
                     f"{args.model} (a .keras or .h5 file loads with keras.models.load_model, "
                     "which needs tfsparse)")
    x = np.load(args.inputs)
    labels = None if args.labels is None else np.load(args.labels)
    if labels is not None and labels.shape != (len(x),):
        parser.error(f"--labels: expected one label per input row, shape ({len(x)},); "
                     f"received shape {labels.shape}")

    def check_inputs(x, shape):
        """The inputs as float32, once they are [n, *shape] (None: any) and floating-point."""
        if x.ndim != 1 + len(shape) or any(
                want is not None and got != want for got, want in zip(x.shape[1:], shape)):
            expected = ", ".join(["n"] + ["any" if d is None else str(d) for d in shape])
            parser.error(f"--inputs: expected inputs of the model's shape ({expected}); "
                         f"received shape {x.shape}")
        if not np.issubdtype(x.dtype, np.floating):
            parser.error(f"--inputs: expected floating-point inputs; received dtype {x.dtype}")
        return x.astype(np.float32)

    if args.model.endswith(".tflite"):
        probabilities = predict_tflite(args.model, x, check_inputs)
    else:
        probabilities = predict_saved_model(args.model, x, check_inputs)
    predictions = probabilities.argmax(axis=1)
    print(f"served {len(x)} inputs from {args.model} without tfsparse")
    print("predictions:", predictions.tolist())
    if labels is not None:
        print("labels:     ", labels.tolist())
        print(f"correct: {(predictions == labels).sum()} of {len(labels)}")


if __name__ == "__main__":
    main()
