"""``partition_rows``: assign every neuron of a sparse network to a worker.

Multi-layer model. Layers are partitioned one after the other, so that the
owner of output ``j`` of layer ``l`` owns input ``j`` of layer ``l + 1``:

- layer 1 is partitioned first with nothing fixed; then each input of the
  network goes to one of the workers that need it, so the first layer's
  volume is exactly the km1 value of its hypergraph;
- layer ``l >= 2`` is partitioned with its input owners fixed by layer
  ``l - 1``; for "hypergraph" they enter as fixed anchor vertices, so the
  km1 objective counts that layer's exact volume;
- "hypergraph" also looks one layer ahead: the next layer's outputs (light,
  unbalanced vertices) and its nets join at a lower net weight, so that
  among equally cheap choices for this layer the one that suits the next
  layer wins (a RadiX-Net layer made of disconnected blocks can put them on
  workers in many ways at zero cost, and only the next layer tells which).

A neuron whose fan-in was pruned away entirely computes a constant: it does
no work and reads nothing, so its owner only decides the next layer's
volume. It is left free while the next layer is partitioned (its net has no
anchor, like a first-layer input) and then goes to one of the workers that
read it, where it costs the fewest words. Pruned networks have many.

Every layer is balanced on its own (each layer is a synchronisation step).
What is exact: each layer's volume given the layers before it; the
look-ahead term is a lower bound of the next layer's volume (hence its low
weight). Then refinement sweeps (one by default) re-partition each level
with both neighbours fixed, where the objective is exact for both layers,
keeping a new assignment only where the exact volume drops.
"""

import numbers
import time

import numpy as np
import scipy.sparse

from tfsparse._validation import check_choice
from tfsparse._validation import check_non_negative_int
from tfsparse._validation import check_positive_int
from tfsparse._validation import invalid_value
from tfsparse._validation import one_of
from tfsparse.partition import _graph
from tfsparse.partition import _hypergraph
from tfsparse.partition._simple import choose_input_owners
from tfsparse.partition._simple import contiguous
from tfsparse.partition._simple import random_contiguous
from tfsparse.partition._sweep import forward_sweep
from tfsparse.partition._sweep import place_constants
from tfsparse.partition._sweep import refine as refine_sweep
from tfsparse.partition.partition import Partition
from tfsparse.partition.volume import pattern_matrix

METHODS = ("hypergraph", "graph", "block", "random")


def kernels_of(weights):
    """Returns the list of kernels of a list of matrices or a SparseDense model.

    Args:
        weights: a list of scipy.sparse matrices or 2-D arrays ``(inputs,
            outputs)``, or a Keras model whose sparse layers have
            ``to_scipy()`` (SparseDense); other layers are skipped.
    """
    if hasattr(weights, "layers"):
        kernels = []
        for layer in weights.layers:
            if hasattr(layer, "to_scipy"):
                kernels.append(layer.to_scipy())
            elif layer.weights:
                raise invalid_value(
                    "weights", "a model whose layers with weights are all SparseDense",
                    received=f"layer {layer.name!r} of type {type(layer).__name__}")
        if not kernels:
            raise invalid_value(
                "weights", "a list of sparse kernels or a model with SparseDense layers",
                received=f"a model without SparseDense layers ({weights.name!r})")
        return kernels
    if scipy.sparse.issparse(weights) or isinstance(weights, np.ndarray):
        weights = [weights]
    return list(weights)


def check_chain(kernels):
    """Checks that the kernels' shapes chain; returns the layer sizes."""
    shapes = [tuple(int(d) for d in np.shape(kernel)) for kernel in kernels]
    if not shapes:
        raise invalid_value("weights", "at least one kernel", received="weights=[]")
    for index, shape in enumerate(shapes):
        if len(shape) != 2 or min(shape) < 1:
            raise invalid_value(
                "weights", "2-D kernels of shape (inputs, outputs)",
                received=f"kernel {index} of shape {shape}")
    for index in range(1, len(shapes)):
        if shapes[index][0] != shapes[index - 1][1]:
            raise invalid_value(
                "weights", "each kernel's input dimension to equal the previous kernel's "
                f"output dimension, but kernel {index} has {shapes[index][0]} inputs and "
                f"kernel {index - 1} has {shapes[index - 1][1]} outputs",
                received=f"shapes={shapes}")
    return [shapes[0][0]] + [shape[1] for shape in shapes]


def _check_method(method):
    check_choice("method", method, METHODS)


def check_workers(sizes, k, epsilon):
    """Checks ``k`` and ``epsilon`` against a network's layer sizes."""
    if (isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real)
            or not 0.0 <= epsilon < 1.0):
        raise invalid_value("epsilon", "a float in [0, 1)", epsilon)
    smallest = min(sizes)
    if (isinstance(k, bool) or not isinstance(k, (int, np.integer))
            or not 1 <= k <= smallest):
        raise invalid_value(
            "k", f"an integer in [1, {smallest}] (the smallest layer has {smallest} "
            "neurons)", k)


def _check_hypergraph_options(lookahead, refine, runs, preset):
    if (isinstance(lookahead, bool) or not isinstance(lookahead, numbers.Real)
            or not 0.0 <= lookahead <= 1.0):
        raise invalid_value("lookahead", "a float in [0, 1]", lookahead)
    check_non_negative_int("refine", refine)
    check_positive_int("runs", runs)
    if not isinstance(preset, str) or preset.lower() not in _hypergraph._PRESETS:
        raise invalid_value("preset", one_of(_hypergraph._PRESETS), preset)


def partition_rows(weights, k, method="hypergraph", epsilon=0.03, seed=0, *,
                   lookahead=0.25, refine=1, runs=1, preset="default",
                   threads=2, progress=False):
    """Assigns every neuron of a chain of sparse layers to one of ``k`` workers.

    Each worker computes the outputs it owns from their fan-in weights (its
    columns of each Keras kernel, the paper's rows of ``W`` in ``y = W x``)
    and first receives the inputs those fan-ins reference that it does not
    own. Methods:

    - ``"hypergraph"``: column-net hypergraph per layer (vertex = output
      neuron weighted by its fan-in size, net = input neuron over the outputs
      that read it, input owners as fixed anchor vertices), connectivity-1
      objective, solved by Mt-KaHyPar. Its objective is the layer's exact
      volume.
    - ``"graph"``: METIS (``pymetis``) on the clique graph of the same model.
    - ``"block"``: contiguous ranges of equal work in every layer.
    - ``"random"``: contiguous ranges of equal work of a seeded random order.

    Args:
        weights: list of ``L`` kernels (scipy.sparse or arrays), kernel ``l``
            of shape ``(n_{l-1}, n_l)`` (``y = x @ W``), or a Keras model of
            SparseDense layers.
        k: number of workers, at most the smallest layer's neuron count.
        method: one of ``"hypergraph"``, ``"graph"``, ``"block"``,
            ``"random"``.
        epsilon: allowed load imbalance in ``[0, 1)``: every layer's busiest
            worker does at most ``(1 + epsilon)`` times the mean work
            ("hypergraph" guarantees it whenever the neurons' work allows
            it, repairing Mt-KaHyPar's rare misses exactly; METIS aims at
            it).
        seed: seed of the partitioner or of the random order. Mt-KaHyPar's
            presets other than ``"deterministic"`` refine in parallel, so the
            same seed can give another partition on another run (3 layers of
            40 neurons, k=4, threads=2: volumes 133-141 over 6 runs); with
            ``preset="deterministic"`` it gives the same one.
        lookahead: "hypergraph" only: weight in ``[0, 1]`` of the next
            layer's nets when a layer is partitioned (0: none). They count the
            next layer's volume for the best unbalanced placement of its
            outputs, a lower bound, hence weighted below the exact nets
            (0.25 with ``refine=1`` was chosen on RadiX-Nets, see the
            README).
        refine: "hypergraph" only: backward sweeps after the first pass,
            each re-partitioning every level with both neighbours fixed
            (exact objective; kept only where the volume drops).
        runs: "hypergraph" only: Mt-KaHyPar runs per layer (different
            seeds); the one with the lowest objective is kept.
        preset: Mt-KaHyPar preset (``"default"``, ``"quality"``,
            ``"deterministic"``, ``"highest_quality"``).
        threads: Mt-KaHyPar threads; Mt-KaHyPar is initialised once per
            process, so only the first hypergraph call's value counts.
        progress: show a progress bar over the layers.

    Returns:
        A ``Partition`` with the owners and their exact costs.

    Raises:
        ValueError: for kernels whose shapes do not chain, an unknown method,
            ``epsilon`` outside ``[0, 1)`` or ``k`` outside
            ``[1, smallest layer]``.

    Example:
        >>> import scipy.sparse
        >>> band = scipy.sparse.diags([1.0, 1.0, 1.0], [-1, 0, 1],
        ...                           shape=(64, 64))
        >>> part = partition_rows([band] * 3, k=4)
        >>> part.volume <= partition_rows([band] * 3, 4, "random").volume
        True
    """
    kernels = kernels_of(weights)
    sizes = check_chain(kernels)
    _check_method(method)
    check_workers(sizes, k, epsilon)
    check_non_negative_int("seed", seed)
    _check_hypergraph_options(lookahead, refine, runs, preset)
    k, epsilon, lookahead = int(k), float(epsilon), float(lookahead)
    patterns = [pattern_matrix(kernel) for kernel in kernels]
    works = [np.asarray(p.sum(axis=0)).ravel() for p in patterns]
    start = time.perf_counter()
    if k == 1:
        owners = [np.zeros(n, dtype=np.int64) for n in sizes]
    elif method == "block":
        owners = [contiguous(np.zeros(sizes[0]), k)]
        owners += [contiguous(work, k) for work in works]
    elif method == "random":
        rng = np.random.default_rng(seed)
        owners = [random_contiguous(np.zeros(sizes[0]), k, rng)]
        owners += [random_contiguous(work, k, rng) for work in works]
    elif method == "hypergraph":
        def partition_level(pattern, fixed, layer, next_pattern=None,
                            next_needs=None):
            return _hypergraph.partition_layer(
                pattern, fixed, k, epsilon, seed + layer, preset.lower(),
                threads, next_pattern, next_needs, lookahead, runs)
        owners = forward_sweep(patterns, k, partition_level, progress)
        owners = refine_sweep(patterns, owners, k, partition_level, refine,
                              progress)
        owners = place_constants(patterns, owners, k)
        owners[0] = choose_input_owners(patterns[0], owners[1], k)
    else:
        owners = forward_sweep(
            patterns, k,
            lambda pattern, fixed, layer, _: _graph.partition_layer(
                pattern, fixed, k, epsilon, seed + layer),
            progress)
        owners[0] = choose_input_owners(patterns[0], owners[1], k)
    seconds = time.perf_counter() - start
    return Partition.from_owners(patterns, owners, k, method=method,
                                 epsilon=epsilon, seed=seed, seconds=seconds)
