"""TFLite inference latency: the MNIST example's sparse model against its dense twin.

Builds the 784-1024-1024-10 ReLU MLP of ``examples/mnist_sparse.py`` twice,
with ``SparseDense`` hidden layers (``--density`` of the weights) and with
``Dense`` ones, trains both for ``--epochs`` on the shipped MNIST sample,
converts the sparse one with ``tfsparse.export.to_tflite`` (gathers over the
nonzeros, and with ``fully_connected=True``) and the dense one with
``tf.lite.TFLiteConverter.from_keras_model`` (all with builtin ops only),
checks each interpreter's outputs against its Keras model on the 1,000
test digits, and times ``invoke()`` of both interpreters interleaved in one
process (medians; ``benchmarks/timing.py``) at each batch size. It prints the
CPU, the file sizes, the latencies and each sparse variant's time over the
dense model's (the ratios the README quotes; above 1 is slower).

``--forms`` adds the sparse model with the segment-sum form (the one XLA
uses) in place of the padded-columns form ``to_tflite`` picks, to show the
choice.

``--hidden`` and ``--density`` change the hidden layers (the example's are
1024 units, 5% dense).

Usage:
    python benchmarks/tflite_latency.py [--batches 1 256] [--threads 1] [--epochs 1] [--forms]
        [--hidden 1024] [--density 0.05]
"""

import argparse
import os
import pathlib
import platform
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfsparse import SparseDense  # noqa: E402
from tfsparse import keras  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.export import to_tflite  # noqa: E402
from tfsparse.ops import tflite as tflite_ops  # noqa: E402
from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)

SPARSE = "SparseDense"
FULLY_CONNECTED = "SparseDense, fully_connected=True"
SEGMENT_SUM = "SparseDense, segment sum"
DENSE = "Dense"


def cpu_model():
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in lines.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def build_mlp(hidden_layer, hidden, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((784,)), hidden_layer(hidden), hidden_layer(hidden),
                             keras.layers.Dense(10, activation="softmax")])


def segment_sum_tflite(model):
    """The sparse model converted with the segment-sum form for every layer."""
    threshold = tflite_ops._MAX_PADDING_FACTOR
    tflite_ops._MAX_PADDING_FACTOR = 0.0  # any padding test fails: segment sum
    try:
        return to_tflite(model)
    finally:
        tflite_ops._MAX_PADDING_FACTOR = threshold


def dense_tflite(model):
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter.convert()


def interpreter_for(flatbuffer, batch, threads):
    interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=threads)
    (inputs,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(inputs["index"], [batch, 784])
    interpreter.allocate_tensors()
    return interpreter


def predict(interpreter, x):
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def check_outputs(flatbuffer, model, x, threads):
    """Largest difference from Keras over ``x``, and the interpreter's outputs."""
    interpreter = interpreter_for(flatbuffer, len(x), threads)
    got = predict(interpreter, x)
    return float(np.abs(got - model.predict(x, verbose=0)).max()), got


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200,
                        help="timed runs per candidate at batch 1 (fewer for larger batches)")
    parser.add_argument("--forms", action="store_true")
    args = parser.parse_args()

    (x_train, y_train), (x_test, y_test) = load_mnist_sample()
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    models = {
        SPARSE: build_mlp(lambda units: SparseDense(units, density=args.density,
                                                    activation="relu"), args.hidden, 0),
        DENSE: build_mlp(lambda units: keras.layers.Dense(units, activation="relu"),
                         args.hidden, 0),
    }
    for name, model in models.items():
        if args.epochs > 0:  # latency does not depend on it; accuracy does
            model.compile("adam", "sparse_categorical_crossentropy")
            print(f"training {name} for {args.epochs} epoch(s)")
            model.fit(x_train, y_train, epochs=args.epochs, batch_size=64, verbose=2)
    models[FULLY_CONNECTED] = models[SPARSE]
    flatbuffers = {DENSE: dense_tflite(models[DENSE]), SPARSE: to_tflite(models[SPARSE]),
                   FULLY_CONNECTED: to_tflite(models[SPARSE], fully_connected=True)}
    if args.forms:
        models[SEGMENT_SUM] = models[SPARSE]
        flatbuffers[SEGMENT_SUM] = segment_sum_tflite(models[SPARSE])

    print(f"\nCPU: {cpu_model()}; TensorFlow {tf.__version__}, tf.lite.Interpreter with "
          f"its default op resolver (builtin kernels + XNNPACK delegate), "
          f"num_threads={args.threads}")
    print(f"{'model':<36} {'file KB':>8} {'max |TFLite - Keras|':>21} {'accuracy':>9}")
    for name, flatbuffer in flatbuffers.items():
        difference, probabilities = check_outputs(flatbuffer, models[name], x_test,
                                                  args.threads)
        accuracy = float((probabilities.argmax(axis=1) == y_test).mean())
        print(f"{name:<36} {len(flatbuffer) / 1024:>8.0f} {difference:>21.2e} {accuracy:>9.4f}")

    sparse_names = [name for name in flatbuffers if name != DENSE]
    print(f"\n{'batch':<5} " + " ".join(f"{name + ' ms':>28}" for name in flatbuffers)
          + "".join(f"   {name} / Dense" for name in sparse_names))
    for batch in args.batches:
        x = x_test[:batch] if batch <= len(x_test) else np.resize(x_test, (batch, 784))
        interpreters = {name: interpreter_for(fb, batch, args.threads)
                        for name, fb in flatbuffers.items()}
        medians = interleaved_medians(
            {name: (lambda it=it: predict(it, x)) for name, it in interpreters.items()},
            repeats=max(10, args.repeats // max(1, batch // 16)))
        print(f"{batch:<5} " + " ".join(f"{1e3 * medians[name]:>28.3f}" for name in flatbuffers)
              + "".join(f"   {medians[name] / medians[DENSE]:>{len(name) + 7}.2f}x"
                        for name in sparse_names))


if __name__ == "__main__":
    main()
