"""``python -m tfsparse.graphchallenge``: the Sparse DNN Graph Challenge benchmark.

Generates a RadiX-Net-style network and MNIST-derived inputs (or reads the
official files with ``--data DIR``), runs the challenge's inference with
tfsparse and with a SciPy CSR baseline in the same process, checks that both
give the same categories (and the truth file's, when ``--data`` has one) and
prints the time of each phase (load, convert, infer), the rate of each
implementation in edges per second (inputs * edges / seconds, median of
``--repeats`` runs), their ratio, and one ``RESULT`` line in the challenge's
fields (neurons, layers, edges, inputs, seconds, edges/s, peak memory).
Exits with status 1 when categories disagree, 2 on a usage error (an
option out of range, a missing file).

Example:
    python -m tfsparse.graphchallenge --neurons 1024 --layers 120 --inputs 60000
"""

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from tfsparse import graphchallenge as gc
from tfsparse._validation import check_non_negative_int, check_positive_int, invalid_value

_INPUTS_HELP = (
    "number of inputs; the challenge uses 60000. Generated inputs are the 5,000 MNIST "
    "digits shipped with tfsparse, resized and binarised, repeated in order beyond 5,000 "
    "(input i is digit i mod 5000: 60000 = the sample tiled 12 times); with --data, the "
    "first N inputs of the images file. Default: 5000 generated, or all of the file"
)


_PROG = "python -m tfsparse.graphchallenge"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Sparse DNN Graph Challenge inference: tfsparse vs a SciPy CSR baseline.",
    )
    parser.add_argument("--neurons", type=int, default=1024, help="neurons per layer (default 1024)")
    parser.add_argument("--layers", type=int, default=120, help="number of layers (default 120)")
    parser.add_argument("--data", type=pathlib.Path, default=None,
                        help="directory of the official TSV files (network, and images and "
                             "categories when present); default: generate")
    parser.add_argument("--inputs", type=int, default=None, help=_INPUTS_HELP)
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the generated network (default 0; not with --data)")
    parser.add_argument("--bias", type=float, default=None,
                        help="bias (default: the challenge's value for --neurons)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="tfsparse inputs per batch (default: about 2^24 activations)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each implementation; the median is reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="TensorFlow intra-op threads (default: TensorFlow's choice)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the SciPy baseline (check against the truth file only)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    try:
        _check_args(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def _check_args(args):
    """Checks the numbers with the project's validation helpers; fills the default bias."""
    for name in ("neurons", "layers", "inputs", "batch_size", "repeats", "threads"):
        value = getattr(args, name)
        if value is not None:  # None: the option's automatic default
            check_positive_int("--" + name.replace("_", "-"), value)
    if args.data is not None and args.seed is not None:
        raise invalid_value("--seed", "no --seed with --data (it seeds a generated network)",
                            args.seed)
    args.seed = check_non_negative_int("--seed", 0 if args.seed is None else args.seed)
    if args.bias is None:
        try:
            args.bias = gc.default_bias(args.neurons)
        except ValueError:
            raise invalid_value(
                "--neurons", "one of the challenge's sizes 1024, 4096, 16384, 65536, or "
                "--bias for another size", args.neurons) from None
    elif not np.isfinite(args.bias):
        raise invalid_value("--bias", "a finite number", args.bias)
    side = int(round(args.neurons ** 0.5))
    images = _existing(args.data, f"sparse-images-{args.neurons}.tsv")
    if images is None and side * side != args.neurons:
        raise invalid_value(
            "--neurons", "a perfect square for generated inputs (images of sqrt(N) x "
            "sqrt(N) pixels), or --data with the images file", args.neurons)
    truth = _existing(args.data, f"neuron{args.neurons}-l{args.layers}-categories.tsv")
    if images is None and truth is not None:
        raise invalid_value(
            "--data", f"a directory holding sparse-images-{args.neurons}.tsv beside {truth.name} "
            "(its categories are those of the official inputs, not of generated ones)",
            str(args.data))


def load_problem(args):
    """Returns (weights, features, truth or None, network and inputs descriptions)."""
    neurons, layers = args.neurons, args.layers
    if args.data is None:
        weights = gc.radixnet(neurons, layers, seed=args.seed)
        network = f"generated RadiX-Net (seed {args.seed})"
    else:
        weights = gc.load_network(args.data, neurons, layers)
        network = f"read from {args.data}"
    images = _existing(args.data, f"sparse-images-{neurons}.tsv")
    if images is not None:
        features = gc.load_features(images, neurons)
        if features.shape[0] == 0:
            raise ValueError(f"The challenge file '{images}' holds no input (no line).")
        source = f"{images}"
        if args.inputs is not None:
            if args.inputs > features.shape[0]:
                raise invalid_value(
                    "--inputs", f"at most the {features.shape[0]} inputs of {images}",
                    received=f"--inputs={args.inputs}")
            features = features[:args.inputs]
    else:
        features = gc.mnist_features(neurons, num_inputs=args.inputs or 5000)
        side = int(round(neurons ** 0.5))
        source = f"shipped MNIST sample, resized to {side}x{side} and binarised"
        if features.shape[0] > 5000:
            source += ", its 5,000 digits repeated in order"
    truth_path = _existing(args.data, f"neuron{neurons}-l{layers}-categories.tsv")
    truth = None
    if truth_path is not None:
        truth = gc.load_categories(truth_path)
        if args.inputs is not None:
            # The categories among the first --inputs inputs. Without it, an
            # id past the inputs read stays: a cut-short images file (whose
            # missing inputs can be no category) then fails the check.
            truth = truth[truth < features.shape[0]]
    return weights, features, truth, network, source


def _existing(directory, name):
    if directory is None:
        return None
    for path in (directory / name, directory / (name + ".gz")):
        if path.is_file():
            return path
    return None


def timed(function, repeats):
    """Returns (last result, median seconds) of ``repeats`` calls."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - start)
    return result, statistics.median(seconds)


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        except RuntimeError as error:  # TensorFlow already started in this process
            sys.exit(f"--threads cannot be applied: {error}")
    start = time.perf_counter()
    try:
        weights, features, truth, network_source, inputs_source = load_problem(args)
    except (FileNotFoundError, ValueError) as error:  # as argparse reports a usage error
        print(f"{_PROG}: error: {error}", file=sys.stderr)
        return 2
    load_seconds = time.perf_counter() - start
    inputs, edges = features.shape[0], gc.count_edges(weights)
    print(f"network: {args.neurons} neurons x {args.layers} layers, {edges:,} edges, {network_source}")
    print(f"inputs: {inputs:,} ({inputs_source}), bias {args.bias}")

    # Conversion to tfsparse's tensors and the tracing of the layer function
    # happen once, outside the timed runs (SciPy uses the matrices as they are).
    start = time.perf_counter()
    network = gc.prepare_network(weights)
    gc.inference(features[:1], network, args.bias, progress=False)
    convert_seconds = time.perf_counter() - start
    ours, ours_seconds = timed(
        lambda: gc.inference(features, network, args.bias, batch_size=args.batch_size,
                             progress=not args.no_progress),
        args.repeats,
    )
    peak = gc.peak_rss_bytes()  # before the SciPy baseline allocates anything
    print(f"time: load {load_seconds:.2f} s, convert {convert_seconds:.2f} s (tfsparse tensors "
          f"and tracing), infer {ours_seconds:.3f} s (median of {args.repeats})")
    print(f"peak memory: {peak / 2**20:,.0f} MiB (process peak RSS, VmHWM, through the "
          "tfsparse inference)")
    ours_categories = gc.categories(ours)
    ok = _check_categories(args, features, weights, ours_categories, ours_seconds, truth)
    print(gc.result_line(args.neurons, args.layers, edges, inputs, ours_seconds, peak))
    return 0 if ok else 1


def _check_categories(args, features, weights, ours_categories, ours_seconds, truth):
    """Prints the comparisons with the SciPy baseline and the truth; True if all agree."""
    inputs, edges = features.shape[0], gc.count_edges(weights)
    ok = True
    print(f"categories: {len(ours_categories):,} of {inputs:,} inputs")
    if not args.no_reference:
        reference, reference_seconds = timed(
            lambda: gc.inference_scipy(features, weights, args.bias, progress=not args.no_progress),
            args.repeats,
        )
        ok = np.array_equal(ours_categories, gc.categories(reference))
        print(f"tfsparse == scipy: {'yes' if ok else 'NO'}")
        ours_rate = inputs * edges / ours_seconds
        reference_rate = inputs * edges / reference_seconds
        print(f"tfsparse: {ours_seconds:.3f} s, {ours_rate:.4g} edges/s (median of {args.repeats})")
        print(f"scipy   : {reference_seconds:.3f} s, {reference_rate:.4g} edges/s "
              f"(median of {args.repeats})")
        print(f"ratio tfsparse / scipy: {ours_rate / reference_rate:.2f}x")
    if truth is not None:
        matches_truth = np.array_equal(ours_categories, truth)
        ok = ok and matches_truth
        print(f"truth: {len(truth):,} categories; tfsparse == truth: {'yes' if matches_truth else 'NO'}")
    else:
        print("truth: no categories file"
              + ("" if args.no_reference else " (checked against the SciPy baseline only)"))
    return ok


if __name__ == "__main__":
    sys.exit(main())
