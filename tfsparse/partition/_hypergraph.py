"""One layer's column-net hypergraph, partitioned by Mt-KaHyPar (km1).

Model of layer ``l`` (kernel ``(n_{l-1}, n_l)``, ``y = x @ W``):

- one vertex per output neuron ``j`` with a nonempty fan-in, weighted by its
  fan-in size (its multiply-adds per sample);
- one net per input neuron ``i``, whose pins are the outputs that read it;
- when the owners of the inputs are already fixed (every layer after the
  first, by the partition of the layer before), ``k`` anchor vertices, anchor
  ``p`` fixed to block ``p``, and net ``i`` also holds the anchor of its
  owner.

With the anchors, the connectivity of net ``i`` is ``|needers(i) + {owner(i)}|``,
so ``connectivity - 1`` is the number of words the owner of ``i`` sends, and the
km1 objective equals the layer's exact communication volume. Without anchors
(first layer) km1 is the volume when each input is owned by one of the workers
that need it, which is how ``owners[0]`` is then chosen. The same holds for
a free input of a later layer (``input_owners[i] == -1``): a neuron with an
empty fan-in computes a constant, reads nothing and costs no work, so its
owner only matters to the layer that reads it and is chosen after it.

Mt-KaHyPar crashes on zero vertex weights, so anchors weigh 1 and each block
may hold one unit more. Mt-KaHyPar treats the limit as a target and misses it
now and then on tiny, heavily pruned layers (under a hundred neurons of very
unequal fan-in over 16 blocks): then up to ``_RETRIES`` more seeds are tried,
and if all miss, greedy moves and swaps repair the last, or, when none fits,
an exact assignment (``_rebalance``).
Outputs with an empty fan-in (no work, no pins) stay
out of the hypergraph and are placed by the caller.
"""

import math

import numpy as np

from tfsparse.partition._rebalance import km1 as weighted_km1
from tfsparse.partition._rebalance import rebalance

_STATE = {}
_EXACT_WEIGHT = 4
_RETRIES = 4
_PRESETS = ("default", "quality", "deterministic", "highest_quality")


def _initializer(threads):
    """Mt-KaHyPar is initialised once per process; later calls reuse it."""
    if "initializer" not in _STATE:
        import mtkahypar
        _STATE["initializer"] = mtkahypar.initialize(int(threads), False)
    return _STATE["initializer"]


def max_block_weight(total, k, epsilon, heaviest):
    """Largest allowed block weight: ``floor((1 + epsilon) * total / k)``.

    Raised to ``ceil(total / k)`` and to the heaviest vertex when those are
    larger, the only cases where the bound cannot be met.
    """
    bound = math.floor((1.0 + epsilon) * total / k + 1e-9)
    return max(bound, math.ceil(total / k), int(heaviest))


def _column_nets(pattern, vertex, anchor_of_input=None):
    """One net per input: the vertices of the outputs reading it (+ anchor).

    ``anchor_of_input[i] < 0`` marks a free input (no anchor).
    """
    nets = []
    for i in range(pattern.shape[0]):
        pins = vertex[pattern.indices[pattern.indptr[i]:pattern.indptr[i + 1]]]
        pins = pins[pins >= 0]
        if (anchor_of_input is not None and pins.size
                and anchor_of_input[i] >= 0):
            pins = np.append(pins, anchor_of_input[i])
        if pins.size >= 2:
            nets.append(pins)
    return nets


def partition_layer(pattern, input_owners, k, epsilon, seed, preset="default",
                    threads=2, next_pattern=None, next_needs=None,
                    lookahead=0.25, runs=1):
    """Assigns the outputs of one layer to ``k`` workers with Mt-KaHyPar.

    Args:
        pattern: CSR pattern ``(inputs, outputs)`` of ones.
        input_owners: int array ``(inputs,)``, or None when the inputs are not
            owned yet (first layer). Entries ``-1`` mark free inputs (neurons
            with an empty fan-in, constants that the caller places afterwards
            on a worker that reads them): their nets get no anchor, so they
            count ``connectivity - 1`` like the first layer's inputs.
        k: number of workers (>= 2).
        epsilon: allowed load imbalance.
        seed: Mt-KaHyPar seed.
        preset: Mt-KaHyPar preset name (``"default"``, ``"quality"``,
            ``"deterministic"`` or ``"highest_quality"``).
        threads: Mt-KaHyPar threads (only the first call of a process counts).
        next_pattern: optional CSR pattern ``(outputs, next_outputs)`` of the
            next layer, for a look-ahead: the next layer's outputs join as
            light vertices and its column nets join too, so km1 adds the
            next layer's volume for the best placement of its outputs (free
            of any balance constraint, so a lower bound; they are placed for
            real when their own layer is partitioned).
        next_needs: optional boolean array ``(outputs, k)``: which workers
            need each output in the next layer, whose owners are fixed. Adds
            one net per output over the output and the anchors of those
            workers, so km1 is the exact volume of this layer plus the next.
        lookahead: weight of the look-ahead nets relative to the exact ones,
            in [0, 1] (quarters).
        runs: Mt-KaHyPar runs with different seeds; the lowest km1 is kept.

    Returns:
        int64 array ``(outputs,)`` with -1 for outputs with an empty fan-in.
    """
    import mtkahypar

    fan_in = np.asarray(pattern.sum(axis=0)).ravel()
    active = np.flatnonzero(fan_in)
    owners = np.full(pattern.shape[1], -1, dtype=np.int64)
    if active.size == 0:
        return owners
    vertex = np.full(pattern.shape[1], -1, dtype=np.int64)
    vertex[active] = np.arange(active.size)
    look_weight = int(round(_EXACT_WEIGHT * lookahead))
    if look_weight == 0:
        next_pattern = None
    n_look = 0
    if next_pattern is not None:
        next_fan_in = np.asarray(next_pattern.sum(axis=0)).ravel()
        look_vertex = np.full(next_pattern.shape[1], -1, dtype=np.int64)
        look_active = np.flatnonzero(next_fan_in)
        n_look = look_active.size
        look_vertex[look_active] = active.size + np.arange(n_look)
    anchored = input_owners is not None or next_needs is not None
    first_anchor = active.size + n_look
    n_vertices = first_anchor + (k if anchored else 0)

    anchor_of_input = None
    if input_owners is not None:
        input_owners = np.asarray(input_owners)
        anchor_of_input = np.where(input_owners >= 0,
                                   first_anchor + input_owners, -1)
    nets = _column_nets(pattern, vertex, anchor_of_input)
    n_current = len(nets)
    if next_pattern is not None:
        for j in active:
            fan_out = next_pattern.indices[
                next_pattern.indptr[j]:next_pattern.indptr[j + 1]]
            if fan_out.size:
                nets.append(np.concatenate([[vertex[j]],
                                            look_vertex[fan_out]]))
    n_look_nets = len(nets) - n_current
    if next_needs is not None:
        for j in active:
            needers = np.flatnonzero(next_needs[j])
            if needers.size:
                nets.append(np.concatenate([[vertex[j]],
                                            first_anchor + needers]))

    work = fan_in[active].astype(np.int64)
    limit = max_block_weight(work.sum(), k, epsilon, work.max())
    if not nets:  # no input is shared: any balanced split costs nothing
        load = np.zeros(k, dtype=np.int64)
        for v in np.argsort(-work, kind="stable"):
            p = int(np.argmin(load))
            owners[active[v]] = p
            load[p] += work[v]
        return owners
    # Light vertices (look-ahead outputs, anchors) weigh 1 and the outputs
    # ``scale`` times their work, with ``scale`` above the light weight one
    # block can hold: then ``scale * limit + light`` bounds a block's work
    # by ``limit`` exactly, whatever light vertices it holds.
    light = n_look + (1 if anchored else 0)
    scale = light + 1 if n_look else 1
    if scale * work.sum() > 2 ** 30:  # Mt-KaHyPar weights are 32-bit
        scale = max(1, 2 ** 30 // int(work.sum()))
    weights = np.concatenate([scale * work,
                              np.ones(n_vertices - active.size, np.int64)])

    # Exact nets weigh _EXACT_WEIGHT, look-ahead nets less (a lower bound).
    net_weights = np.full(len(nets), _EXACT_WEIGHT, dtype=np.int64)
    net_weights[n_current:n_current + n_look_nets] = look_weight
    initializer = _initializer(threads)
    context = initializer.context_from_preset(
        getattr(mtkahypar.PresetType, preset.upper()))
    context.set_partitioning_parameters(k, float(epsilon),
                                        mtkahypar.Objective.KM1)
    context.logging = False
    context.set_individual_target_block_weights([scale * limit + light] * k)
    def build():
        hypergraph = initializer.create_hypergraph(
            context, n_vertices, len(nets), nets, weights, net_weights)
        if anchored:
            hypergraph.add_fixed_vertices([-1] * first_anchor + list(range(k)), k)
        return hypergraph

    balance_work = np.concatenate([work, np.zeros(n_vertices - active.size,
                                                   np.int64)])
    # Best (unbalanced, km1) first; up to _RETRIES extra seeds are tried
    # while no run met the block limit, before repairing.
    best, best_key = None, None
    for run in range(runs + _RETRIES):
        if run >= runs and not best_key[0]:
            break
        mtkahypar.set_seed(int(seed) + 7919 * run)
        # A fresh hypergraph per run: partitioning one twice crashes
        # Mt-KaHyPar 1.7 (k = 2, preset "highest_quality": a segmentation fault).
        # Keep ``hypergraph`` referenced until the blocks are copied out: old
        # Mt-KaHyPar releases crash when it is collected before its partition.
        hypergraph = build()
        partitioned = hypergraph.partition(context)
        blocks = np.array(partitioned.get_partition(), dtype=np.int64)
        km1 = partitioned.km1()
        del partitioned
        over = np.bincount(blocks, weights=balance_work,
                           minlength=k).max() > limit
        if (over and run == runs + _RETRIES - 1
                and (best_key is None or best_key[0])):
            # Mt-KaHyPar went over a block's limit every time (it can, with
            # fixed vertices and few heavy vertices): repair, then rescore.
            blocks, balanced = rebalance(blocks, balance_work, limit, nets,
                                         net_weights, k)
            over = not balanced
            km1 = weighted_km1(nets, net_weights, blocks)
        key = (bool(over), km1)
        if best_key is None or key < best_key:
            best, best_key = blocks, key
    del hypergraph
    owners[active] = best[:active.size]
    return owners
