"""A pruned ResNet end to end: dense vs pruned-dense vs sparsified, side by side in one process.

The small ResNet of ``examples/sparse_resnet_mnist.py`` (stem, four residual
blocks of 3x3 Conv2D + BatchNorm + ReLU with residual Adds, 16 then 32
channels, GlobalAveragePooling, Dense) trains dense on the MNIST sample
shipped with tfsparse; copies are pruned with tfmot to each ``--sparsities``
(``prune_low_magnitude``, polynomial schedule, fine-tuning, ``strip_pruning``;
every convolution but the stem, and the Dense layer), then ``sparsify``d:

- "sparsified": every pruned layer (``max_density=0.5``; the stem stays dense);
- "sparsify() default": the default rule (convolutions only below the
  measured crossover density, ``CONV2D_CROSSOVER_DENSITY``);
- "sparsify(measure=...)": the measured rule, each layer timed against its
  sparse twin on its own input shape, at the inference batch.

It prints each sparsify report, the test accuracy of every model and whether
each sparsified model predicts what its pruned model does (same classes,
largest logit difference), then the inference time of a batch of test images
and the training-step time (forward, gradients, Adam update) of every model,
all interleaved in the same rounds (medians), with ratios against the dense
and the pruned-dense model, the CPU and the kernel variant.

About six minutes on 2 shared cores. Usage:
    python benchmarks/sparse_resnet.py [--epochs 4] [--prune-epochs 6] [--sparsities 0.9 0.95]
        [--repeats 20] [--inference-batch 128] [--quick]
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tensorflow as tf  # noqa: E402

import tfsparse  # noqa: E402
from fssl_mnist import inference_function  # noqa: E402  (benchmarks/fssl_mnist.py)
from fssl_mnist import train_step_function  # noqa: E402
from sparse_resnet_mnist import BATCH_SIZE  # noqa: E402  (examples/sparse_resnet_mnist.py)
from sparse_resnet_mnist import compare_predictions  # noqa: E402
from sparse_resnet_mnist import compile_model  # noqa: E402
from sparse_resnet_mnist import load_data  # noqa: E402
from sparse_resnet_mnist import prune  # noqa: E402
from sparse_resnet_mnist import train_dense  # noqa: E402
from timing import describe_machine  # noqa: E402  (benchmarks/timing.py)
from timing import interleaved_medians  # noqa: E402
from timing import isas_to_run  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="dense training epochs")
    parser.add_argument("--prune-epochs", type=int, default=6,
                        help="fine-tuning epochs under pruning, per sparsity")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.9, 0.95])
    parser.add_argument("--width", type=int, default=16, help="channels of the first blocks")
    parser.add_argument("--inference-batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 256 digits, 1 epoch, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.prune_epochs, args.repeats, args.inference_batch = 1, 1, 3, 32
    return args


def sparsified_models(pruned, sparsity, inference_batch):
    """The three sparsify rules on one pruned model: ``{label: (model, report)}``."""
    rules = {
        "sparsified": dict(max_density=0.5),
        "sparsify() default": {},
        "sparsify(measure='inference')": dict(measure="inference", max_density=0.5,
                                              batch_size=inference_batch),
    }
    models = {}
    for label, kwargs in rules.items():
        model, report = tfsparse.sparsify(pruned, report=True, **kwargs)
        models[f"{label} {sparsity:.0%}"] = (compile_model(model), report)
    return models


def build_models(args):
    """``(models, reports, pruned label of each sparsified model)``, all trained."""
    data = load_data(limit=256 if args.quick else None)
    dense = train_dense(data, args.epochs, args.width)
    models, reports, pruned_of = {"dense": dense}, {}, {}
    for sparsity in args.sparsities:
        pruned_label = f"pruned-dense {sparsity:.0%}"
        models[pruned_label] = prune(dense, data, sparsity, args.prune_epochs)
        for label, (model, report) in sparsified_models(
                models[pruned_label], sparsity, args.inference_batch).items():
            models[label], reports[label], pruned_of[label] = model, report, pruned_label
    return data, models, reports, pruned_of


def print_accuracy(data, models, pruned_of):
    _, (x_test, y_test) = data
    print("\n| model | converted layers | test accuracy | same class as pruned "
          "| largest logit difference (largest logit) |\n|---|---|---|---|---|")
    for label, model in models.items():
        accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
        cells = ["-", "-"]
        if label in pruned_of:
            same, difference, largest = compare_predictions(models[pruned_of[label]], model,
                                                            x_test)
            cells = [f"{same:.1%}", f"{difference:.1e} ({largest:.1f})"]
        converted = sum(type(layer).__name__.startswith("Sparse") for layer in model.layers)
        print(f"| {label} | {converted} | {accuracy:.3f} | {' | '.join(cells)} |")


def print_times(data, models, pruned_of, args):
    (x_train, y_train), (x_test, _) = data
    batch = tf.constant(x_test[:args.inference_batch])
    x, y = tf.constant(x_train[:BATCH_SIZE]), tf.constant(y_train[:BATCH_SIZE])
    inference = interleaved_medians(
        {label: inference_function(model, batch) for label, model in models.items()},
        repeats=args.repeats)
    steps = interleaved_medians(
        {label: train_step_function(model, x, y, False) for label, model in models.items()},
        repeats=args.repeats)
    print(f"\ninference of {args.inference_batch} test digits and one training step of "
          f"{BATCH_SIZE}, medians of {args.repeats} interleaved runs (ratio: the other "
          "model's time / this one's; above 1 this one is faster)")
    print("| model | inference (ms) | vs dense | vs pruned-dense | train step (ms) | vs dense "
          "| vs pruned-dense |\n|---|---|---|---|---|---|---|")
    for label in models:
        cells = []
        for times in (inference, steps):
            reference = times[pruned_of[label]] if label in pruned_of else None
            cells += [f"{times[label] * 1e3:.2f}", f"{times['dense'] / times[label]:.2f}x",
                      "-" if reference is None else f"{reference / times[label]:.2f}x"]
        print(f"| {label} | {' | '.join(cells)} |")


def main(argv=None):
    args = parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # one trace per model is expected, not a warning
    print(describe_machine(isas_to_run("default")))
    data, models, reports, pruned_of = build_models(args)
    for label, report in reports.items():
        print(f"\n{label}:\n{report}")
    print_accuracy(data, models, pruned_of)
    print_times(data, models, pruned_of, args)
    print(f"\n{describe_machine(isas_to_run('default'))}; ResNet width {args.width}, "
          f"{args.epochs} epochs dense + {args.prune_epochs} of pruning per sparsity")


if __name__ == "__main__":
    main()
