"""Hypergraph partitioning of sparse networks over workers, and its execution.

``partition_rows`` assigns every neuron of a chain of sparse layers to one of
``k`` workers (Mt-KaHyPar on the column-net hypergraph, METIS, contiguous
blocks or a random order) and returns a ``Partition`` with the exact
communication volume and load imbalance per layer.
``python -m tfsparse.partition`` compares the methods on a network.
``distribute`` runs a SparseDense model partitioned over Horovod ranks
(``model.fit`` under ``horovodrun``) and ``collect_weights`` brings the
weights back. ``volume_lower_bound`` proves how few words any balanced
partition of a network can send.

Example:
  >>> from tfsparse.partition import banded_network, partition_rows
  >>> network = banded_network(64, layers=3, window=2)
  >>> blocks = partition_rows(network, 4, "block")
  >>> blocks.volume < partition_rows(network, 4, "random").volume
  True
"""

from tfsparse.partition.bound import volume_lower_bound
from tfsparse.partition.compare import compare_methods
from tfsparse.partition.distributed import collect_weights
from tfsparse.partition.distributed import distribute
from tfsparse.partition.networks import banded_network
from tfsparse.partition.networks import relabel_neurons
from tfsparse.partition.partition import Partition
from tfsparse.partition.plan import network_plans
from tfsparse.partition.rows import METHODS
from tfsparse.partition.rows import partition_rows
from tfsparse.partition.volume import communication_volume

__all__ = [
    "METHODS",
    "Partition",
    "banded_network",
    "collect_weights",
    "communication_volume",
    "compare_methods",
    "distribute",
    "network_plans",
    "partition_rows",
    "relabel_neurons",
    "volume_lower_bound",
]
