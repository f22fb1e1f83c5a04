"""Structured-sparsity regularisers (group lasso) for dense and sparse kernels.

Example:
  >>> import tensorflow as tf
  >>> from tfsparse.regularizers import GroupLasso, dense_group_norms, group_sparsity
  >>> kernel = tf.constant([[3.0, 0.0], [4.0, 0.0]])
  >>> float(GroupLasso(0.5, groups="columns")(kernel))  # 0.5 * (|(3, 4)| + |(0, 0)|)
  2.5
  >>> float(group_sparsity(dense_group_norms(kernel, "columns"), 0.0))  # zero columns
  0.5
"""

from tfsparse.regularizers.group_lasso import GroupLasso
from tfsparse.regularizers.group_lasso import RegularizerSum
from tfsparse.regularizers.group_lasso import group_lasso_terms
from tfsparse.regularizers.group_lasso import without_group_lasso
from tfsparse.regularizers.group_norms import dense_group_norms
from tfsparse.regularizers.group_norms import dense_keep_mask
from tfsparse.regularizers.group_norms import group_ids
from tfsparse.regularizers.group_norms import group_sparsity
from tfsparse.regularizers.group_norms import num_groups
from tfsparse.regularizers.group_norms import safe_norm
from tfsparse.regularizers.group_norms import sparse_group_norms
from tfsparse.regularizers.group_norms import sparse_keep_mask

__all__ = [
    "GroupLasso",
    "RegularizerSum",
    "dense_group_norms",
    "dense_keep_mask",
    "group_ids",
    "group_lasso_terms",
    "group_sparsity",
    "num_groups",
    "safe_norm",
    "sparse_group_norms",
    "sparse_keep_mask",
    "without_group_lasso",
]
