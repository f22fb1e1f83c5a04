"""RigL on tfsparse against RigL as its reference implementations do it (dense kernel x mask).

    python benchmarks/dynamic_sparsity_speed.py [--widths 4096 4096] [--sparsity 0.95]
        [--update-every 21] [--rounds 3]

Both train the same MLP (784-4096-4096-10 at 95% sparsity in every layer,
Adam, batch 64) on the shipped MNIST sample, one epoch per ``fit`` call,
interleaved round by round, with RigL updates every ``--update-every`` steps
(included in the epoch time):

* tfsparse: SparseDense layers (the nonzeros only) and
  ``callbacks.DynamicSparsity("rigl")`` (blockwise dense gradient);
* masked: the way google-research/rigl and tfmot do it, written here: a dense
  kernel multiplied by a 0/1 mask in every step, whose backward pass gives
  the dense gradient of the masked kernel (kept at update steps, as RigL's
  optimizer does), and an update with ``tf.math.top_k`` over all positions
  for the drop and the grow that zeroes the grown weights' Adam moments.

Both take RigL's grow gradient from the update step's own batch and backward
pass. Every model runs ``fit`` once per epoch, the two alternating (and
which goes first alternating too), so both see the same load on a shared
machine. Epoch times are wall-clock and CPU time of the process (all its
threads): CPU time counts only this process's work, so it varies less when
other processes compete for the cores.

Prints medians of the epoch times, the ratios with their spread over the
rounds, and the share of each epoch spent in the updates.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from callbacks import DynamicSparsity  # noqa: E402
from dynamic_common import compile_for_mnist  # noqa: E402
from dynamic_common import mnist  # noqa: E402
from dynamic_common import platform_line  # noqa: E402
from dynamic_common import sparse_mlp  # noqa: E402
from tfsparse._keras import keras  # noqa: E402
from tfsparse.dynamic import drop_fraction_at  # noqa: E402

END_STEP = 10**9  # the schedule's end is far: every update moves ~alpha of the nonzeros


class MaskedDense(keras.layers.Layer):
    """Dense with a fixed-size random mask: kernel * mask in every step.

    As google-research/rigl's ``SparseRigLOptimizer``, the step's own
    backward pass gives the dense gradient of the masked kernel; at armed
    steps (update steps) it is kept in ``dense_gradient`` for the update.
    """

    def __init__(self, units, density, seed, activation=None):
        super().__init__()
        self.units, self.density, self.seed = units, density, seed
        self.activation = keras.activations.get(activation)

    def build(self, input_shape):
        fan_in = int(input_shape[-1])
        rng = np.random.default_rng(self.seed)
        mask = np.zeros((fan_in, self.units), np.float32)
        per_column = max(1, int(round(self.density * fan_in)))
        for column in range(self.units):
            mask[rng.choice(fan_in, per_column, replace=False), column] = 1
        scale = np.sqrt(6 / (per_column + self.density * self.units))  # sparse fans
        self.kernel = self.add_weight("kernel", (fan_in, self.units), initializer=(
            keras.initializers.RandomUniform(-scale, scale, seed=self.seed)))
        self.mask = self.add_weight("mask", (fan_in, self.units), trainable=False,
                                    initializer=keras.initializers.Constant(mask))
        self.bias = self.add_weight("bias", (self.units,), initializer="zeros")
        self.dense_gradient = self.add_weight("dense_gradient", (fan_in, self.units),
                                              trainable=False, initializer="zeros")
        self.armed = self.add_weight("armed", (), tf.bool, trainable=False,
                                     initializer="zeros")

    def call(self, inputs):
        @tf.custom_gradient
        def masked_kernel(kernel):
            def gradient_function(gradient):  # d loss / d (kernel * mask), dense
                def keep():
                    with tf.control_dependencies([self.dense_gradient.assign(gradient)]):
                        return tf.identity(gradient * self.mask)
                return tf.cond(self.armed, keep, lambda: gradient * self.mask)

            return kernel * self.mask, gradient_function

        return self.activation(tf.matmul(inputs, masked_kernel(self.kernel)) + self.bias)


class MaskedRigL(keras.callbacks.Callback):
    """RigL on masks, as the reference implementations do it (dense TF ops)."""

    def __init__(self, update_every):
        super().__init__()
        self.update_every = update_every
        self.seconds = 0.0

    def _layers(self):
        return [layer for layer in self.model.layers if isinstance(layer, MaskedDense)]

    def on_train_batch_begin(self, batch, logs=None):
        if (int(self.model.optimizer.iterations.numpy()) + 1) % self.update_every == 0:
            for layer in self._layers():
                layer.armed.assign(True)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.update_every == 0:
            start = time.perf_counter()
            fraction = drop_fraction_at(step, 0.3, END_STEP)
            for layer in self._layers():
                layer.armed.assign(False)
                self.update_layer(layer, layer.dense_gradient, fraction)
            self.seconds += time.perf_counter() - start

    def update_layer(self, layer, gradient, fraction):
        mask = tf.reshape(layer.mask, [-1])
        active = int(tf.reduce_sum(mask))
        count = int(fraction * active)
        lowest = tf.float32.min
        drop_score = tf.where(mask > 0, tf.abs(tf.reshape(layer.kernel, [-1])), lowest)
        _, keep = tf.math.top_k(drop_score, active - count)
        kept = tf.scatter_nd(keep[:, None], tf.ones([active - count]), mask.shape)
        grow_score = tf.where(kept > 0, lowest, tf.abs(tf.reshape(gradient, [-1])))
        _, grow = tf.math.top_k(grow_score, count)
        grown = tf.scatter_nd(grow[:, None], tf.ones([count]), mask.shape)
        new_connections = tf.reshape((grown > 0) & (mask == 0), layer.mask.shape)
        layer.kernel.assign(tf.where(new_connections, 0.0, layer.kernel))
        optimizer = self.model.optimizer
        index = optimizer._index_dict[optimizer._var_key(layer.kernel)]
        for slots in (optimizer._momentums, optimizer._velocities):
            slots[index].assign(tf.where(new_connections, 0.0, slots[index]))
        layer.mask.assign(tf.reshape(kept + grown, layer.mask.shape))


def masked_mlp(widths, density, seed):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((784,))]
    layers += [MaskedDense(w, density, seed * 100 + i, "relu") for i, w in enumerate(widths)]
    layers.append(MaskedDense(10, density, seed * 100 + len(widths)))
    return keras.Sequential(layers)


def timed_epoch(model, callback, x, y, batch_size):
    """One epoch of ``fit``: wall seconds, CPU seconds, seconds in the updates."""
    before = getattr(callback, "seconds", 0.0)
    wall, cpu = time.perf_counter(), time.process_time()
    history = model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=True,
                        callbacks=[callback])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if isinstance(callback, DynamicSparsity):
        updates = history.history["dynamic_sparsity/update_seconds"][-1]
    else:
        updates = callback.seconds - before
    return wall, cpu, updates


def report(times, args, steps):
    print(f"\n{platform_line()}")
    print(f"MLP 784-{'-'.join(map(str, args.widths))}-10 at {args.sparsity:.0%} sparsity, "
          f"batch {args.batch_size}, {steps} steps per epoch, RigL update every "
          f"{args.update_every} steps; medians of {args.rounds} interleaved epochs\n")
    print("| RigL implementation | epoch, wall (s) | epoch, CPU time (s) | "
          "share of the epoch (wall) in updates |")
    print("|---|---|---|---|")
    for name, rounds in times.items():
        wall, cpu, updates = np.array(rounds).T
        print(f"| {name} | {np.median(wall):.2f} | {np.median(cpu):.2f} | "
              f"{np.median(updates / wall):.1%} |")
    masked, sparse = np.array(times["masked"]), np.array(times["tfsparse"])
    for column, clock in ((0, "wall"), (1, "CPU time")):
        ratios = masked[:, column] / sparse[:, column]
        ratio = np.median(masked[:, column]) / np.median(sparse[:, column])
        print(f"{clock}: tfsparse RigL is {ratio:.1f}x faster per epoch than dense-kernel x "
              f"mask RigL (target >= 5x); per round {ratios.min():.1f}x-{ratios.max():.1f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[4096, 4096])
    parser.add_argument("--sparsity", type=float, default=0.95)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--update-every", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    (x, y), _ = mnist()
    density = 1 - args.sparsity
    runs = {
        "tfsparse": (compile_for_mnist(sparse_mlp(args.widths, density, seed=0)),
                     DynamicSparsity("rigl", update_every=args.update_every, end_step=END_STEP)),
        "masked": (compile_for_mnist(masked_mlp(args.widths, density, seed=0)),
                   MaskedRigL(args.update_every)),
    }
    times = {name: [] for name in runs}
    for round_index in range(args.rounds + 1):  # round 0 warms up (traces)
        for name in (list(runs) if round_index % 2 else list(runs)[::-1]):
            wall, cpu, updates = timed_epoch(*runs[name], x, y, args.batch_size)
            if round_index:
                times[name].append((wall, cpu, updates))
            print(f"round {round_index} {name}: epoch {wall:.2f} s wall, {cpu:.2f} s CPU, "
                  f"updates {updates:.2f} s", flush=True)
    report(times, args, int(np.ceil(len(x) / args.batch_size)))


if __name__ == "__main__":
    main()
