"""FSSL as a fine-tune of a Graph Challenge network against its own outputs.

The network is the generated RadiX-Net (``tfsparse.graphchallenge.radixnet``,
1024 neurons, 120 layers by default, 32 nonzeros per row and column, weights
1/16, bias -0.3, ReLU clipped at 32) on challenge-style MNIST inputs
(``mnist_features``). It is written as a Keras model, one ``SparseDense`` and
one ``ReLU(max_value=32)`` per layer, whose outputs equal the challenge's
SciPy reference (checked here).

FSSL: a copy of the network gets ``GroupLasso`` on the columns (neurons) of
every layer and is trained with ``callbacks.FSSL`` to reproduce the original
network's final activations (mean squared error) on the first
``--train-inputs`` inputs; then ``tfsparse.fssl.compact`` removes the
neurons it zeroed. Reported: the share of neurons removed, the agreement of
the challenge categories (inputs with a nonzero final row) of the compacted
and the original network on all 5,000 inputs (most not trained on), and the
inference rate before and after, timed side by side in one process
(interleaved medians; ``inputs * edges / second`` with each network's own
edges, and with the original network's edges for the compacted one).

It also prints, per layer, the share of units whose clipped ReLU has a
nonzero derivative on the training inputs. On the generated 1024 x 120
network that share is 0 from layer 20 on (every unit is dead or clipped at
32 on every input), so the exact gradient of the data loss with respect to
every weight is 0: the fine-tune has no data term to balance the group
penalty, which shrinks all columns of this symmetric network alike. In our
runs it removed no neuron (weak penalty) or killed the whole network (strong
penalty); see the README for the measured table.

Usage:
    python benchmarks/fssl_graphchallenge.py [--layers 120] [--epochs 8] [--prune-epoch 4]
        [--l 1e-3] [--optimizer sgd] [--learning-rate 1e-2]
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tqdm  # noqa: E402

from tfsparse._keras import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from callbacks.fssl import FSSL  # noqa: E402
from tfsparse import fssl  # noqa: E402
from tfsparse.graphchallenge import categories  # noqa: E402
from tfsparse.graphchallenge import default_bias  # noqa: E402
from tfsparse.graphchallenge import inference_scipy  # noqa: E402
from tfsparse.graphchallenge import mnist_features  # noqa: E402
from tfsparse.graphchallenge import radixnet  # noqa: E402
from tfsparse.graphchallenge.sparse_inference import CLIP  # noqa: E402
from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.regularizers import GroupLasso  # noqa: E402
from timing import interleaved_medians  # noqa: E402  (benchmarks/timing.py)


class EpochBar(keras.callbacks.Callback):
    """A tqdm bar over the epochs of one fit."""

    def __init__(self, epochs):
        super().__init__()
        self.bar = tqdm.tqdm(total=epochs, desc="FSSL fine-tune", unit="epoch")

    def on_epoch_end(self, epoch, logs=None):
        self.bar.set_postfix(loss=f"{logs['loss']:.4f}",
                             sparsity=f"{logs['fssl/group_sparsity']:.3f}")
        self.bar.update()

    def on_train_end(self, logs=None):
        self.bar.close()


def challenge_model(weights, bias, regularizer=None):
    """The challenge network as Keras layers: relu(min(Y @ W + b, 32)) per layer."""
    layers = [keras.Input((weights[0].shape[0],))]
    for index, weight in enumerate(weights):
        layers.append(SparseDense(
            weight.shape[1], pattern=weight, name=f"layer_{index}",
            bias_initializer=keras.initializers.Constant(bias),
            kernel_regularizer=regularizer() if regularizer else None))
        layers.append(keras.layers.ReLU(max_value=CLIP, name=f"relu_{index}"))
    return keras.Sequential(layers, name="graph_challenge")


def gradient_regime(model, x, every=10):
    """Per layer, the share of units whose clipped ReLU has a nonzero derivative.

    A unit passes gradient only when its pre-activation is strictly inside
    (0, 32); dead (<= 0) and saturated (>= 32) units pass none.
    """
    shares, activations = {}, x
    for index in range(0, len(model.layers), 2):
        z = model.layers[index](activations)
        activations = model.layers[index + 1](z)
        layer = index // 2
        if layer % every == 0 or index + 2 == len(model.layers):
            shares[layer] = float(tf.reduce_mean(tf.cast((z > 0) & (z < CLIP), tf.float32)))
    return shares


def kernel_nnz(model):
    return sum(layer.nnz if isinstance(layer, SparseDense) else int(np.prod(layer.kernel.shape))
               for layer in model.layers
               if isinstance(layer, (SparseDense, keras.layers.Dense)))


def forward(model, x, batch_size):
    call = tf.function(lambda inputs: model(inputs, training=False))
    batches = [tf.constant(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]
    return lambda: np.concatenate([call(batch).numpy() for batch in batches])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neurons", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=120)
    parser.add_argument("--train-inputs", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--prune-epoch", type=int, default=4)
    parser.add_argument("--l", type=float, default=1e-3, help="group lasso strength")
    parser.add_argument("--threshold", type=float, default=0.05, help="group norm threshold")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default="out/fssl_graphchallenge.json")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    bias = default_bias(args.neurons)
    weights = radixnet(args.neurons, args.layers)
    features = mnist_features(args.neurons)
    x = features.toarray()
    original = challenge_model(weights, bias)
    target = forward(original, x, 1000)()
    reference = inference_scipy(features, weights, bias).toarray()
    print(f"Keras network vs challenge SciPy reference: largest difference "
          f"{np.abs(target - reference).max():.2e}, categories {len(categories(target))} "
          f"of {len(x)} inputs")

    regime = gradient_regime(original, x[:args.train_inputs])
    print("share of units with a nonzero activation derivative, by layer: "
          + ", ".join(f"{layer}: {share:.3f}" for layer, share in regime.items()))

    keras.utils.set_random_seed(0)
    student = challenge_model(weights, bias, lambda: GroupLasso(args.l, "columns"))
    student.set_weights(original.get_weights())
    optimizer = (keras.optimizers.SGD(args.learning_rate) if args.optimizer == "sgd"
                 else keras.optimizers.Adam(args.learning_rate))
    student.compile(optimizer, "mse")
    start = time.perf_counter()
    history = student.fit(
        x[:args.train_inputs], target[:args.train_inputs], epochs=args.epochs,
        batch_size=args.batch_size, verbose=0,
        callbacks=[FSSL(args.threshold, prune_epoch=args.prune_epoch),
                   EpochBar(args.epochs)]).history
    fit_seconds = time.perf_counter() - start
    print("epoch loss:", " ".join(f"{v:.4g}" for v in history["loss"]))
    print("epoch group sparsity:", " ".join(f"{v:.3f}" for v in history["fssl/group_sparsity"]))
    rows = fssl.report(student, print_fn=None)
    compacted = fssl.compact(student)

    hidden = [layer for layer in compacted.layers
              if isinstance(layer, (SparseDense, keras.layers.Dense))]
    units_before = args.neurons * (args.layers - 1)  # hidden neurons; the outputs all stay
    units_after = sum(layer.units for layer in hidden[:-1])
    inputs_kept = fssl.kept_inputs(student).size
    functions = {"original": forward(original, x, 1000), "compacted": forward(compacted, x, 1000)}
    outputs = {name: function() for name, function in functions.items()}
    seconds = interleaved_medians(functions, args.repeats)
    categories_before = set(categories(outputs["original"]).tolist())
    categories_after = set(categories(outputs["compacted"]).tolist())
    agree = np.mean([(i in categories_before) == (i in categories_after) for i in range(len(x))])
    untrained = range(args.train_inputs, len(x))
    agree_unseen = np.mean([(i in categories_before) == (i in categories_after) for i in untrained])
    edges_before, edges_after = kernel_nnz(original), kernel_nnz(compacted)
    rate = {name: len(x) * edges / seconds[name]
            for name, edges in (("original", edges_before), ("compacted", edges_after))}
    effective = len(x) * edges_before / seconds["compacted"]

    print(f"\nGraph Challenge network {args.neurons} neurons x {args.layers} layers, "
          f"FSSL fine-tune: {args.epochs} epochs ({args.prune_epoch} with GroupLasso "
          f"l={args.l:g} on columns), {args.train_inputs} training inputs, {fit_seconds:.0f} s")
    print(f"hidden neurons removed: {units_before - units_after} of {units_before} "
          f"({100 * (1 - units_after / units_before):.1f}%); input pixels kept {inputs_kept}")
    print(f"edges: {edges_before:,} -> {edges_after:,} "
          f"({100 * (1 - edges_after / edges_before):.1f}% removed)")
    print(f"categories: original {len(categories_before)}, compacted {len(categories_after)}; "
          f"agreement {100 * agree:.2f}% of {len(x)} inputs, {100 * agree_unseen:.2f}% of the "
          f"{len(untrained)} not trained on")
    print("| network | edges | inference of 5,000 inputs (s) | edges/s (own edges) |")
    print("|---|---|---|---|")
    print(f"| original | {edges_before:,} | {seconds['original']:.3f} | {rate['original']:.3g} |")
    print(f"| FSSL compacted | {edges_after:,} | {seconds['compacted']:.3f} | "
          f"{rate['compacted']:.3g} |")
    print(f"speed-up {seconds['original'] / seconds['compacted']:.2f}x; compacted rate counted "
          f"with the original edges: {effective:.3g} edges/s")
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "args": vars(args), "fit_s": fit_seconds, "history": history, "report": rows,
        "hidden_units": [units_before, units_after], "edges": [edges_before, edges_after],
        "categories": [len(categories_before), len(categories_after)],
        "gradient_regime": regime, "agreement": agree, "agreement_unseen": agree_unseen,
        "seconds": seconds,
        "edges_per_second": rate}, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
