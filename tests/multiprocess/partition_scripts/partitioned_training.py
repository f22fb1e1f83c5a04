"""Run under horovodrun: partitioned model vs the whole model in this process.

Writes OUT/rank{r}.json with the largest differences and the traffic counts.
Usage: partitioned_training.py OUT METHOD EXCHANGE_INPUTS NETWORK
NETWORK: "tanh" (three layers, tanh then linear) or "softmax" (the issue's
relu -> softmax, whose softmax must see whole rows).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402
from tfsparse._keras import keras  # noqa: E402  (Keras 2 before Horovod)
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

from tfsparse.layers import SparseDense  # noqa: E402
from tfsparse.partition import Partition  # noqa: E402
from tfsparse.partition import partition_rows  # noqa: E402
from tfsparse.partition.rows import kernels_of  # noqa: E402
from tfsparse.partition.distributed import collect_weights  # noqa: E402
from tfsparse.partition.distributed import distribute  # noqa: E402
from tfsparse.partition.distributed import exchange  # noqa: E402

NETWORKS = {  # layer sizes, activations
    "tanh": ((24, 32, 28, 20), ("tanh", "tanh", None)),
    "softmax": ((12, 16, 8), ("relu", "softmax")),
}
STEPS, BATCH = 5, 8


def build_model(network):
    """The same model on every rank: seeded patterns, values and biases."""
    sizes, activations = NETWORKS[network]
    rng = np.random.default_rng(0)
    layers = []
    for index, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        kernel = scipy.sparse.random(a, b, density=0.2, random_state=rng,
                                     format="csr", dtype=np.float32)
        kernel.data = rng.standard_normal(kernel.nnz).astype(np.float32)
        kernel = kernel + scipy.sparse.eye(a, b, dtype=np.float32)  # no dead units
        layers.append(SparseDense(b, pattern=kernel.tocsr(), activation=activations[index],
                                  bias_initializer=keras.initializers.RandomNormal(
                                      seed=index)))
    model = keras.Sequential([keras.Input((sizes[0],))] + layers)
    return model


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def input_gradient(network_model, batch):
    """d(sum of squared outputs)/d(batch)."""
    with tf.GradientTape() as tape:
        tape.watch(batch)
        total = tf.reduce_sum(tf.square(network_model(batch)))
    return tape.gradient(total, batch)


def log(message):
    print(f"[rank {hvd.rank()}] {message}", file=sys.stderr, flush=True)


def main(out, method, exchange_inputs, network):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    sizes = NETWORKS[network][0]
    if rank == 0:
        # A layer only rank 0 makes shifts Keras's automatic names there:
        # the ranks' layers and models are named differently (Horovod named
        # their collectives after them, and the ranks waited forever).
        SparseDense(2, density=0.5)
    model = build_model(network)
    partition = partition_rows(model, size, method) if rank == 0 else None
    partition = hvd.broadcast_object(partition, root_rank=0)
    log("partition broadcast")
    dist = distribute(model, partition, exchange_inputs=exchange_inputs)
    log("distributed model built")

    rng = np.random.default_rng(1)
    x = rng.standard_normal((STEPS * BATCH, sizes[0])).astype(np.float32)
    y = rng.standard_normal((STEPS * BATCH, sizes[-1])).astype(np.float32)
    result = {"rank": rank, "size": size}

    # Outputs and gradients of one batch.
    loss_fn = keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        full_loss = loss_fn(y[:BATCH], model(x[:BATCH]))
    full_grads = tape.gradient(full_loss, model.trainable_variables)
    with tf.GradientTape() as tape:
        out_dist = dist(x[:BATCH])
        dist_loss = loss_fn(y[:BATCH], out_dist)
    dist_grads = tape.gradient(dist_loss, dist.trainable_variables)
    log("forward and backward done")
    result["output_diff"] = max_diff(out_dist, model(x[:BATCH]))
    result["output_scale"] = float(np.max(np.abs(model(x[:BATCH]))))
    result["row_sums"] = np.sum(out_dist.numpy(), axis=1).tolist()
    grad_diffs = []
    for layer_index, part in enumerate(dist.partitioned_layers):
        g_values, g_bias = full_grads[2 * layer_index], full_grads[2 * layer_index + 1]
        d_values, d_bias = dist_grads[2 * layer_index], dist_grads[2 * layer_index + 1]
        grad_diffs.append(max_diff(d_values, tf.gather(g_values, part.plan.positions)))
        grad_diffs.append(max_diff(d_bias, tf.gather(g_bias, part.plan.owned_outputs)))
    result["grad_diff"] = max(grad_diffs)
    result["grad_scale"] = max(float(np.max(np.abs(g))) for g in full_grads)

    # The gradient of the inputs (what a layer before the model would get):
    # every rank's, summed over the ranks, is the whole model's.
    batch = tf.constant(x[:BATCH])
    full_input_grad, dist_input_grad = (
        input_gradient(network_model, batch) for network_model in (model, dist))
    result["input_grad_diff"] = max_diff(dist_input_grad, full_input_grad)
    result["input_grad_scale"] = float(np.max(np.abs(full_input_grad)))
    # Clipping by norms would clip each rank's shard by its own norm.
    try:
        dist.compile(keras.optimizers.SGD(0.1, clipnorm=1.0), "mse")
        result["clipnorm_refused"] = ""
    except ValueError as error:
        result["clipnorm_refused"] = str(error)
    # Owners that differ between ranks (rank 1's relabelled): every rank refuses.
    owners = [o if rank == 0 else (o + 1) % size for o in partition.owners]
    try:
        distribute(model, Partition.from_owners(kernels_of(model), owners, size))
        result["relabelled_refused"] = ""
    except ValueError as error:
        result["relabelled_refused"] = str(error)
    # Every neuron of the last layer on rank 0: every rank refuses alike
    # (before, the others failed on a shape of 0 while rank 0 went on).
    owners = [o.copy() for o in partition.owners]
    owners[-1][:] = 0
    try:
        distribute(model, Partition.from_owners(kernels_of(model), owners, size))
        result["ownerless_refused"] = ""
    except ValueError as error:
        result["ownerless_refused"] = str(error)
    log("input gradient and refusals done")

    # Traffic: what alltoall actually moved, per layer, against the partition.
    # Horovod reports per source rank what each rank received; gathering
    # those reports gives what each rank actually sent.
    sent, received = [], []
    for layer_index, plan in enumerate(dist.partition_plans):
        owned = tf.ones((3, plan.owned_inputs.size))
        local, splits = exchange(owned, plan, name=f"traffic_check_{layer_index}")
        report = hvd.allgather(tf.reshape(splits, (1, size))).numpy()
        sent.append(int(report[:, rank].sum()))
        received.append(int(local.shape[1] - plan.owned_inputs.size))
    result["sent"] = sent
    result["received"] = received
    result["predicted_send"] = partition.send[:, rank].tolist()
    result["predicted_recv"] = partition.recv[:, rank].tolist()
    result["predicted_layer_volume"] = partition.layer_volume.tolist()
    result["sum_sent"] = hvd.allreduce(tf.constant(sent, tf.int64), op=hvd.Sum).numpy().tolist()
    log("traffic checked")
    # Several SGD steps with model.fit, against the whole model in this process.
    reference = build_model(network)
    reference.set_weights(model.get_weights())
    reference.compile(keras.optimizers.SGD(0.1), "mse")
    reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    dist.compile(keras.optimizers.SGD(0.1), "mse")
    history = dist.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    collect_weights(dist, model)
    result["weight_diff"] = max(max_diff(a, b) for a, b in
                                zip(model.get_weights(), reference.get_weights()))
    result["weights_changed"] = max_diff(model.get_weights()[0],
                                         build_model(network).get_weights()[0])
    result["loss"] = history.history["loss"]
    result["pattern_kept"] = all(
        np.array_equal(a.pattern.rows, b.pattern.rows)
        and np.array_equal(a.pattern.cols, b.pattern.cols)
        for a, b in zip(model.layers, reference.layers))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4])
