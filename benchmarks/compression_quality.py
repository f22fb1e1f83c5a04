"""SIDCo's estimation quality (achieved / target count) on real and synthetic gradients.

    python benchmarks/compression_quality.py [--ratios 0.01 0.001] [--steps 50] [--out out/compression_quality]

Gradients:
  * real: 50 training steps of a Keras MLP (784-256-128-10) on the shipped
    MNIST sample, and of the same network with `tfsparse.layers.SparseDense`
    hidden layers (density 0.1); each step's gradients, flattened and
    concatenated as the fused optimizer sees them, are saved to
    ``<out>/gradients_<model>.npz`` and then replayed;
  * synthetic: 50 fresh draws of 1,000,000 Laplace, Gaussian and Student-t(3)
    values per step.
For every family, distribution and ratio, one adaptive SIDCo compresses the
50 steps in order, and the median (and quartiles) of achieved/target over the
50 steps is reported, with the stage count it ends on. The real gradients are
replayed twice: as saved, and through `ErrorFeedback` (as in training:
``g + residual`` is compressed). The synthetic families are compressed as
drawn: adding residuals to i.i.d. draws would turn every family into a
near-Gaussian mixture (the residual is a sum of many past draws), so the data
would no longer be the family named. The issue's target: the median in
[0.8, 1.25] for each distribution family that fits the data.
``--fit-zeros`` runs the paper's estimator, which also fits the exact zeros.
"""

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tfsparse  # noqa: E402,F401  (selects Keras 2 first)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tfsparse import keras  # noqa: E402
from tfsparse.compression import ErrorFeedback  # noqa: E402
from tfsparse.compression import SIDCo  # noqa: E402
from tfsparse.data import load_mnist_sample  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402

DISTRIBUTIONS = ("exponential", "gpareto", "gamma")
BAND = (0.8, 1.25)


def mnist_model(sparse):
    keras.utils.set_random_seed(0)
    hidden = (lambda units: SparseDense(units, density=0.1, seed=units, activation="relu")) if sparse \
        else (lambda units: keras.layers.Dense(units, activation="relu"))
    return keras.Sequential([keras.Input((784,)), hidden(256), hidden(128), keras.layers.Dense(10)])


def save_training_gradients(sparse, steps, path):
    """Trains with Adam for `steps` batches of 64 and saves every step's flat gradient."""
    (x, y), _ = load_mnist_sample()
    x = x.reshape(len(x), -1).astype(np.float32) / 255.0
    model = mnist_model(sparse)
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.concat([tf.reshape(g, [-1]) for g in grads], 0)

    flats = []
    for i in range(steps):
        start = (i * 64) % (len(x) - 64)
        flats.append(step(x[start:start + 64], y[start:start + 64].astype(np.int32)).numpy())
    gradients = np.stack(flats)
    np.savez_compressed(path, gradients=gradients)
    return gradients


def synthetic(family, steps, size=1_000_000, seed=0):
    rng = np.random.default_rng(seed)
    draw = {"Laplace": rng.laplace, "Gaussian": rng.normal,
            "Student-t(3)": lambda size: rng.standard_t(3, size=size)}[family]
    return (draw(size=size).astype(np.float32) for _ in range(steps))


def replay(gradients, ratio, distribution, error_feedback, exclude_zeros=True):
    """Compresses the steps in order; returns achieved/target per step and the final stages."""
    gradients = list(gradients)
    size = gradients[0].size
    compressor = SIDCo(ratio, distribution=distribution, exclude_zeros=exclude_zeros)
    if error_feedback:
        feedback = ErrorFeedback(compressor, [tf.Variable(tf.zeros([size]))])
        compress = tf.function(lambda g: tf.size(feedback.compress([g])[0]))
    else:
        compress = tf.function(lambda g: tf.size(compressor.compress(g)[0]))
    target = int(compressor.target_count(size))
    qualities = [int(compress(tf.constant(g))) / target for g in gradients]
    return np.array(qualities), int(compressor.stages.numpy())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.001])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", default="out/compression_quality")
    parser.add_argument("--fit-zeros", action="store_true",
                        help="the paper's estimator: fit exact zeros too (SIDCo(exclude_zeros=False))")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    families = {}  # name -> (gradients, with error feedback)
    for name, sparse in [("MNIST MLP (Dense)", False), ("MNIST MLP (SparseDense)", True)]:
        path = out / f"gradients_{'sparse' if sparse else 'dense'}_mlp.npz"
        gradients = save_training_gradients(sparse, args.steps, path)
        families[name] = (gradients, False)
        families[name + " + error feedback"] = (gradients, True)
        print(f"{name}: saved {gradients.shape[0]} steps x {gradients.shape[1]:,} elements to {path} "
              f"({np.mean(gradients == 0):.1%} exact zeros)")
    for family in ("Laplace", "Gaussian", "Student-t(3)"):
        families[family] = (np.stack(list(synthetic(family, args.steps))), False)

    print(f"\nMedian achieved/target over {args.steps} steps (quartiles; final stage count), "
          f"adaptive SIDCo, exclude_zeros={not args.fit_zeros}\n")
    header = "| gradients | ratio | " + " | ".join(DISTRIBUTIONS) + " |"
    print(header)
    print("|" + "---|" * (2 + len(DISTRIBUTIONS)))
    misses = []
    cases = [(f, r) for f in families for r in args.ratios]
    rows = []
    for family, ratio in tqdm(cases, desc="families x ratios", file=sys.stderr):
        cells = []
        for distribution in DISTRIBUTIONS:
            gradients, error_feedback = families[family]
            qualities, stages = replay(gradients, ratio, distribution, error_feedback,
                                       exclude_zeros=not args.fit_zeros)
            median = float(np.median(qualities))
            low, high = np.percentile(qualities, [25, 75])
            inside = BAND[0] <= median <= BAND[1]
            cells.append(f"{median:.2f} ({low:.2f}-{high:.2f}; {stages} st.){'' if inside else ' *'}")
            if not inside:
                misses.append((family, ratio, distribution, median))
        rows.append(f"| {family} | {ratio} | " + " | ".join(cells) + " |")
    print("\n".join(rows))
    print(f"\n* median outside [{BAND[0]}, {BAND[1]}]")
    for family, ratio, distribution, median in misses:
        print(f"  {family}, ratio {ratio}, {distribution}: {median:.2f}")


if __name__ == "__main__":
    main()
