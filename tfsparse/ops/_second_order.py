"""Gradients of the compiled ops themselves: the gradients of gradients.

``sparse_matmul`` and ``sparse_conv2d`` give their first-order gradients by
``tf.custom_gradient``, whose backward functions run the compiled ops
(``TfsparseSpmm`` for ``dy @ W^T``, ``TfsparseSddmm`` for the values). A
gradient of such a gradient (a gradient penalty, a Hessian-vector product)
differentiates those ops, so they are registered here:

* ``y = bias + x @ W`` (``TfsparseSpmm``, ``W[idx[k], seg[k]] = values[k]``):
  ``dx = dy @ W^T`` (the op on the transposed pattern, its nonzeros sorted
  by input), ``dvalues = sddmm(x, dy)`` at the pattern, ``dbias`` the sum of
  ``dy`` over the batch;
* ``out[k] = x[:, rows[k]] . dy[:, cols[k]]`` (``TfsparseSddmm``): ``dx =
  dy @ G^T`` and ``ddy = x @ G`` with ``G[rows[k], cols[k]] = g[k]``, two
  SpMMs.

Each is built from the same ops, so any order works. The convolution's ops
have no such gradients yet: a clear error says so.
"""

import tensorflow as tf

from tfsparse.ops import kernels


def _spmm(isa, x, values, idx, seg, units):
    """``x @ M`` with ``M[idx[k], seg[k]] = values[k]`` (any order of the nonzeros)."""
    order = tf.argsort(seg, stable=True)
    return kernels._library().tfsparse_spmm(
        x, values, idx, seg, tf.zeros([0], x.dtype), tf.cast(order, tf.int32),
        units=units, isa=isa)


def _static_width(tensor, axis, what):
    width = tensor.shape[axis]
    if width is None:
        raise ValueError(
            f"A gradient of tfsparse's gradient needs the static {what}; received a tensor "
            f"of shape {tensor.shape}.")
    return int(width)


def _isa(op):
    """The kernel variant the forward op ran (its gradient runs the same)."""
    isa = op.get_attr("isa")
    return isa.decode() if isinstance(isa, bytes) else isa


@tf.RegisterGradient("TfsparseSpmm")
def _spmm_gradient(op, dy):
    x, values, idx, seg, bias, _ = op.inputs
    isa = _isa(op)
    n_in = _static_width(x, 1, "input width of the product")
    dx = _spmm(isa, dy, values, seg, idx, n_in)  # dy @ W^T: W^T[seg[k], idx[k]]
    dvalues = kernels._library().tfsparse_sddmm(x, dy, idx, seg, isa=isa, batch_major=True)
    dbias = tf.reduce_sum(dy, axis=0) if bias.shape[0] != 0 else tf.zeros_like(bias)
    return [dx, dvalues, None, None, dbias, None]


@tf.RegisterGradient("TfsparseSddmm")
def _sddmm_gradient(op, g):
    x, dy, rows, cols = op.inputs
    isa = _isa(op)
    batch_major = op.get_attr("batch_major")
    if not batch_major:  # [input_dim, batch] and [units, batch]
        x, dy = tf.transpose(x), tf.transpose(dy)
    n_in = _static_width(x, 1, "input width of the SDDMM")
    n_out = _static_width(dy, 1, "output width of the SDDMM")
    dx = _spmm(isa, dy, g, cols, rows, n_in)  # dy @ G^T
    ddy = _spmm(isa, x, g, rows, cols, n_out)  # x @ G
    if not batch_major:
        dx, ddy = tf.transpose(dx), tf.transpose(ddy)
    return [dx, ddy, None, None]


def _no_second_order(name):
    def gradient(op, *grads):
        raise LookupError(
            f"tfsparse's {name} (a SparseConv2D or sparse_conv2d gradient) has no gradient "
            "of its own: a gradient of the convolution's gradient (a gradient penalty, a "
            "Hessian-vector product) is not supported yet. SparseDense and sparse_matmul "
            "support it.")

    tf.RegisterGradient(name)(gradient)


for _name in ("TfsparseSparseConvForward", "TfsparseSparseConvBackpropInput",
              "TfsparseSparseConvBackpropValues"):
    _no_second_order(_name)
