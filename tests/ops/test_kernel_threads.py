"""The compiled kernels on an intra-op pool of many threads (blocks.h).

The kernels split their work into blocks that the calling thread and the
pool's tasks take one at a time, the tasks scheduling each other two at a
time (so with 8 threads, tasks scheduled by tasks that may start after the
last block was taken). TensorFlow fixes its pools' sizes once per process,
so the case runs in a process of its own.
"""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import numpy as np, scipy.sparse, tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(8)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from tfsparse.ops import SparsityPattern, kernels

    eps = np.finfo(np.float32).eps
    n = 4096
    # Over 2**18 nonzeros: the passes over the input gradient's order are
    # split over the pool too (spmm.cc).
    pattern = SparsityPattern.random((n, n), 80 / n, seed=0)
    assert pattern.nnz > 2**18
    rng = np.random.default_rng(0)
    values = rng.standard_normal(pattern.nnz).astype(np.float32)
    w = scipy.sparse.csr_matrix((values.astype(np.float64), (pattern.rows, pattern.cols)),
                                shape=(n, n))
    w_abs = abs(w)

    def check_product(got, a, kernel, kernel_abs):
        # Each output is a sum of at most n products: float32 rounding is
        # bounded by (n + 2) * eps * sum|a_i b_i|, entry by entry.
        bound = (n + 2) * eps * (abs(a) @ kernel_abs)
        assert np.all(np.abs(got - a @ kernel) <= bound), "product off its reference"

    for variant in kernels.supported_isas() or [None]:
        with kernels.use_isa(variant):
            for batch in (1, 8, 40, 256):
                x = rng.standard_normal((batch, n)).astype(np.float32)
                dy = rng.standard_normal((batch, n)).astype(np.float32)
                y = kernels.spmm(x, values, pattern.rows, pattern.cols, n).numpy()
                check_product(y, x.astype(np.float64), w, w_abs)
                for _ in range(2):  # the kept permuted pattern: made, then reused
                    dx = kernels.spmm(dy, values, pattern.cols, pattern.rows, n,
                                      order=pattern.row_major_order).numpy()
                    check_product(dx, dy.astype(np.float64), w.T, w_abs.T)
                dvalues = kernels.sddmm(x.T.copy(), dy.T.copy(), pattern.rows, pattern.cols).numpy()
                # x and dy as they are, transposed by the op (split over the
                # pool); x of batch 256 (4 MiB) summed in slices of the batch.
                batch_major = kernels.sddmm(x, dy, pattern.rows, pattern.cols,
                                            batch_major=True).numpy()
                if x.nbytes <= 2**21:
                    assert np.array_equal(batch_major, dvalues), "batch-major SDDMM differs"
                for begin in range(0, pattern.nnz, 32768):
                    r = pattern.rows[begin:begin + 32768]
                    c = pattern.cols[begin:begin + 32768]
                    a, b = x.T[r].astype(np.float64), dy.T[c].astype(np.float64)
                    bound = (batch + 2) * eps * np.sum(np.abs(a * b), axis=1)
                    for got in (dvalues, batch_major):
                        error = np.abs(got[begin:begin + 32768] - np.sum(a * b, axis=1))
                        assert np.all(error <= bound), "SDDMM off its reference"
    print("ok")
""")


def test_kernels_on_a_pool_of_eight_threads_match_the_reference():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
