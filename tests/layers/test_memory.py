"""A 65536 x 65536 SparseDense never allocates a dense kernel (16 GiB)."""

import os
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf
    from tfsparse.layers import SparseDense
    n = 65536
    layer = SparseDense(n, density=32 / n, seed=0)
    x = tf.random.normal((8, n))
    with tf.GradientTape() as tape:
        y = layer(x)
        loss = tf.reduce_sum(y * y)
    grads = tape.gradient(loss, layer.trainable_weights)
    assert layer.nnz == 32 * n and grads[0].shape == (32 * n,)
    from tfsparse._memory import peak_rss_bytes  # VmHWM: not pytest's peak
    print(peak_rss_bytes())
    """
)


def test_huge_layer_forward_and_backward_stay_far_below_dense_kernel_size():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True,
                            capture_output=True, text=True, timeout=600)
    peak_bytes = int(result.stdout.split()[-1])
    dense_kernel_bytes = 65536 * 65536 * 4
    # Peak resident memory of the whole process (TensorFlow itself is ~1 GiB).
    assert peak_bytes < 3 * 2**30 < dense_kernel_bytes / 5, peak_bytes
