"""The Sparse DNN Graph Challenge: RadiX-Net generator, TSV I/O, inference, rate.

``python -m tfsparse.graphchallenge --neurons 1024 --layers 120`` generates a
network and MNIST-derived inputs (or reads the official files with
``--data DIR``), runs tfsparse and a SciPy CSR baseline, checks the
categories and prints edges per second and a one-line ``RESULT`` in the
challenge's fields.

Example:
  >>> from tfsparse.graphchallenge import count_edges, radixnet
  >>> weights = radixnet(1024, 3)
  >>> count_edges(weights)
  98304
"""

from tfsparse.graphchallenge.features import mnist_features
from tfsparse.graphchallenge.generator import radixnet
from tfsparse.graphchallenge.generator import radixnet_strides
from tfsparse.graphchallenge.generator import shift_sum_matrix
from tfsparse.graphchallenge.sparse_inference import categories
from tfsparse.graphchallenge.sparse_inference import count_edges
from tfsparse.graphchallenge.sparse_inference import default_bias
from tfsparse.graphchallenge.sparse_inference import inference
from tfsparse.graphchallenge.sparse_inference import inference_scipy
from tfsparse.graphchallenge.sparse_inference import prepare_network
from tfsparse.graphchallenge.sparse_inference import PreparedNetwork
from tfsparse.graphchallenge.report import parse_result_line
from tfsparse.graphchallenge.report import peak_rss_bytes
from tfsparse.graphchallenge.report import result_line
from tfsparse.graphchallenge.tsv import load_categories
from tfsparse.graphchallenge.tsv import load_features
from tfsparse.graphchallenge.tsv import load_network
from tfsparse.graphchallenge.tsv import write_categories
from tfsparse.graphchallenge.tsv import write_features
from tfsparse.graphchallenge.tsv import write_network

__all__ = [
    "PreparedNetwork",
    "categories",
    "count_edges",
    "default_bias",
    "inference",
    "inference_scipy",
    "load_categories",
    "load_features",
    "load_network",
    "mnist_features",
    "parse_result_line",
    "peak_rss_bytes",
    "prepare_network",
    "radixnet",
    "radixnet_strides",
    "result_line",
    "shift_sum_matrix",
    "write_categories",
    "write_features",
    "write_network",
]
