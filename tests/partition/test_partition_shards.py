"""The partitioned SparseDense core: the rule, and shards that compute the layer.

Both consumers (``distribute`` over Horovod, the pipeline's grouped stages)
build on these; the last test checks that both apply the same rule.
"""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

from tfsparse._keras import keras
from tfsparse.distribute._partitioned import find_runs
from tfsparse.layers import SparseDense
from tfsparse.partition import partition_rows
from tfsparse.partition.distributed import _sparse_layers
from tfsparse.partition.shards import assemble
from tfsparse.partition.shards import ends_run
from tfsparse.partition.shards import finish_outputs
from tfsparse.partition.shards import layer_shard
from tfsparse.partition.shards import shard_outputs
from tfsparse.partition.shards import shard_weights
from tfsparse.partition.shards import unpartitionable_reason


def doubled(t):  # a custom activation: element-wise, but not known to be
    return 2.0 * t


# name: (layer, reason it cannot be partitioned, whether it ends a run)
CASES = {
    "relu": (lambda: SparseDense(6, density=0.5, activation="relu"), None, False),
    "linear": (lambda: SparseDense(6, density=0.5), None, False),
    "softmax": (lambda: SparseDense(6, density=0.5, activation="softmax"), None, True),
    "custom": (lambda: SparseDense(6, density=0.5, activation=doubled), None, True),
    "kernel_regularizer": (lambda: SparseDense(6, density=0.5, kernel_regularizer="l2"),
                           "its kernel_regularizer is set", False),
    "activity_regularizer": (lambda: SparseDense(6, density=0.5, activity_regularizer="l1"),
                             "its activity_regularizer is set", False),
    "bias_constraint": (lambda: SparseDense(6, density=0.5, bias_constraint="non_neg"),
                        "its bias_constraint is set", False),
    "dense": (lambda: keras.layers.Dense(6), "it is a Dense, not a SparseDense layer", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rule(case):
    make, reason, ends = CASES[case]
    layer = make()
    layer.build((None, 8))
    assert unpartitionable_reason(layer) == reason
    if reason is None:
        assert ends_run(layer) is ends


def test_a_layer_on_sequences_is_not_partitioned():
    layer = SparseDense(6, density=0.5)
    layer(np.ones((2, 3, 8), "float32"))
    assert unpartitionable_reason(layer) == (
        "it is applied to 3-D inputs, not to 2-D inputs (batch, features)")


def numpy_activation(name):
    if name == "softmax":
        return lambda v: np.exp(v - v.max(1, keepdims=True)) / np.exp(
            v - v.max(1, keepdims=True)).sum(1, keepdims=True)
    return {"relu": lambda v: np.maximum(v, 0.0), "doubled": lambda v: 2.0 * v,
            "tanh": np.tanh}[name]


@pytest.mark.parametrize("activation", ["relu", "tanh", "softmax", "doubled"])
@pytest.mark.parametrize("k,method", [(2, "block"), (3, "random")])
def test_shards_assembled_compute_the_layer(activation, k, method):
    rng = np.random.default_rng(0)
    kernel = scipy.sparse.random(20, 12, density=0.3, random_state=rng, format="csr",
                                 dtype=np.float32) + scipy.sparse.eye(20, 12, dtype=np.float32)
    layer = SparseDense(12, pattern=kernel.tocsr(),
                        activation=doubled if activation == "doubled" else activation,
                        bias_initializer=keras.initializers.RandomNormal(seed=1))
    layer.build((None, 20))
    part = partition_rows([kernel], k, method, seed=2)
    x = rng.standard_normal((5, 20)).astype(np.float32)
    owned, owners = [], []
    for rank in range(k):
        shard = layer_shard(layer, part.owners[0], part.owners[1], rank, k)
        values, bias = shard_weights(layer, shard)
        local = tf.gather(x, shard.plan.local_inputs, axis=1)
        owned.append(shard_outputs(shard, local, values, bias, layer.activation))
        owners.append(shard.plan.owned_outputs)
    order = np.argsort(np.concatenate(owners))
    got = finish_outputs(tf.gather(tf.concat(owned, axis=1), order, axis=1), layer.activation)
    weights = layer.to_scipy().toarray()
    want = numpy_activation(activation)(x @ weights + layer.bias.numpy())
    # float32 sums of at most ~8 products of O(1) values in another order.
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    if activation == "softmax":  # normalised over whole rows, not a worker's slice
        np.testing.assert_allclose(got.numpy().sum(axis=1), 1.0, rtol=1e-6)


def test_shard_weights_assemble_back_to_the_layer():
    layer = SparseDense(9, density=0.4, seed=3, bias_initializer="random_normal")
    layer.build((None, 11))
    kernel = layer.to_scipy()
    part = partition_rows([kernel], 3, "random", seed=0)
    shards = [layer_shard(layer, part.owners[0], part.owners[1], r, 3) for r in range(3)]
    weights = [shard_weights(layer, shard) for shard in shards]
    values = assemble([w[0] for w in weights], [s.plan.positions for s in shards], layer.nnz)
    bias = assemble([w[1] for w in weights], [s.plan.owned_outputs for s in shards],
                    layer.units)
    np.testing.assert_array_equal(values.numpy(), layer.values.numpy())
    np.testing.assert_array_equal(bias.numpy(), layer.bias.numpy())


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_consumers_follow_the_rule(case):
    make, reason, ends = CASES[case]
    layer, last = make(), SparseDense(4, density=0.5, activation="relu")
    model = keras.Sequential([keras.Input((8,)), layer, last])
    # The pipeline: a layer ends its run, or is left out of any.
    runs = find_runs([layer, last], [(0, 1)], [("/cpu:0", "/cpu:1")], "devices")
    if reason is not None:
        assert runs == [(0, (1,))]
    else:
        assert runs == ([(0, (0,)), (0, (1,))] if ends else [(0, (0, 1))])
    # distribute: the whole model is one run, so only a last layer may end it.
    if reason is None and not ends:
        assert _sparse_layers(model) == [layer, last]
    else:
        with pytest.raises(ValueError, match=f"Received: layer {layer.name!r}"):
            _sparse_layers(model)
    last_only = keras.Sequential([keras.Input((8,)), SparseDense(6, density=0.5), make()])
    if reason is None:
        assert len(_sparse_layers(last_only)) == 2
