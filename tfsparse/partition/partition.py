"""``Partition``: who owns each neuron, and what that costs per sample."""

import json

import numpy as np

from tfsparse.partition.volume import communication_volume


class Partition:
    """A neuron-to-worker assignment of a sparse network, with its exact costs.

    ``owners[0]`` owns the network's inputs and ``owners[l]`` the outputs of
    layer ``l`` (which are the inputs of layer ``l + 1``). The cost arrays
    have one row per layer and one column per worker, all per sample:
    ``send[l, p]`` and ``recv[l, p]`` are the words worker ``p`` sends and
    receives before layer ``l + 1`` (the forward exchange; the backward pass
    moves the same words back), ``load[l, p]`` its multiply-adds in that
    layer. Gathering the network's outputs, if a run needs them on every
    worker, is not part of the volume: it costs ``(k - 1) * n_L`` words
    whatever the partition.

    Build one with ``partition_rows`` or ``Partition.from_owners``.

    Example:
        >>> import scipy.sparse
        >>> w = [scipy.sparse.eye(4, format="csr")] * 2
        >>> part = Partition.from_owners(w, [[0, 0, 1, 1]] * 3, k=2)
        >>> part.volume, part.imbalance
        (0, 0.0)
    """

    def __init__(self, owners, k, send, recv, load, method="given",
                 epsilon=None, seed=None, seconds=None):
        self.owners = [np.asarray(o, dtype=np.int64) for o in owners]
        self.k = int(k)
        self.send = np.asarray(send, dtype=np.int64)
        self.recv = np.asarray(recv, dtype=np.int64)
        self.load = np.asarray(load, dtype=np.int64)
        self.method = str(method)
        self.epsilon = None if epsilon is None else float(epsilon)
        self.seed = None if seed is None else int(seed)
        self.seconds = None if seconds is None else float(seconds)

    @classmethod
    def from_owners(cls, kernels, owners, k, **metadata):
        """Computes the exact costs of ``owners`` on ``kernels``.

        Args:
            kernels: list of ``L`` kernels ``(n_{l-1}, n_l)``.
            owners: list of ``L + 1`` int arrays.
            k: number of workers.
            **metadata: ``method``, ``epsilon``, ``seed``, ``seconds``.
        """
        send, recv, load = communication_volume(kernels, owners, k)
        return cls(owners, k, send, recv, load, **metadata)

    @property
    def num_layers(self):
        return len(self.owners) - 1

    @property
    def sizes(self):
        """Neurons per level: ``[n_0, ..., n_L]``."""
        return [int(o.size) for o in self.owners]

    @property
    def volume(self):
        """Total words sent per sample in a forward pass, all layers."""
        return int(self.send.sum())

    @property
    def max_volume(self):
        """Words sent per sample by the busiest sender, over all layers."""
        return int(self.send.sum(axis=0).max()) if self.send.size else 0

    @property
    def layer_volume(self):
        """Total words sent per sample before each layer, ``(L,)``."""
        return self.send.sum(axis=1)

    @property
    def layer_max_send(self):
        return self.send.max(axis=1)

    @property
    def layer_max_recv(self):
        return self.recv.max(axis=1)

    @property
    def layer_imbalance(self):
        """Per layer ``max_p load / mean_p load - 1`` (0 for an empty layer)."""
        mean = self.load.mean(axis=1)
        peak = self.load.max(axis=1)
        return np.where(mean > 0, peak / np.where(mean > 0, mean, 1) - 1, 0.0)

    @property
    def imbalance(self):
        """Worst load imbalance over the layers."""
        return float(self.layer_imbalance.max()) if self.load.size else 0.0

    def layer_table(self):
        """Returns a text table: per layer volume, max send/recv, imbalance."""
        lines = [f"{'layer':>5} {'volume':>9} {'max send':>9} "
                 f"{'max recv':>9} {'imbalance':>9}"]
        for layer in range(self.num_layers):
            lines.append(
                f"{layer + 1:>5} {self.layer_volume[layer]:>9} "
                f"{self.layer_max_send[layer]:>9} "
                f"{self.layer_max_recv[layer]:>9} "
                f"{self.layer_imbalance[layer]:>9.4f}")
        return "\n".join(lines)

    def save(self, path):
        """Writes the partition to ``path`` (a NumPy ``.npz`` archive)."""
        metadata = {"k": self.k, "method": self.method,
                    "epsilon": self.epsilon, "seed": self.seed,
                    "seconds": self.seconds, "levels": len(self.owners)}
        arrays = {f"owners_{level}": o for level, o in enumerate(self.owners)}
        with open(path, "wb") as handle:
            np.savez_compressed(handle, send=self.send, recv=self.recv,
                                load=self.load,
                                metadata=np.array(json.dumps(metadata)),
                                **arrays)

    @classmethod
    def load(cls, path):
        """Reads a partition written by ``save``."""
        with np.load(path, allow_pickle=False) as archive:
            metadata = json.loads(str(archive["metadata"]))
            owners = [archive[f"owners_{level}"]
                      for level in range(metadata.pop("levels"))]
            return cls(owners, send=archive["send"], recv=archive["recv"],
                       load=archive["load"], **metadata)

    def __repr__(self):
        return (f"Partition(method={self.method!r}, k={self.k}, "
                f"layers={self.num_layers}, volume={self.volume}, "
                f"max_volume={self.max_volume}, "
                f"imbalance={self.imbalance:.4f})")
