// TfsparseSddmm: the gradient of a sparse kernel's values.
//
//   out[k] = sum_b x_t[rows[k], b] * dy_t[cols[k], b]      for k in [0, nnz)
//
// x_t is the layer input transposed ([input_dim, batch]) and dy_t the output
// gradient transposed ([units, batch]), so every term is a dot product of two
// contiguous rows. With batch_major, x_t and dy_t are given as the layer
// has them, x [batch, input_dim] and dy [batch, units], and the op
// transposes them itself into scratch buffers (transpose_variant.inc, split
// over the pool): up to 2 MiB of x (SliceRows) the same sums in the same
// order as on transposed inputs, equal bit for bit; a larger x in slices of
// the batch, each transposed on its own and summed into the result after
// the one before, so that the random reads of x's rows stay in L2. One
// slice at a time: transposed into one pair of buffers (a slice's size),
// then its products, which read it from cache. Against transposing every
// slice first into buffers of the whole batch (same-process A/B on an AMD
// EPYC, Zen 5, 2 cores, medians of 40, two runs, one in reversed order):
// 0.90-0.92x the time on AVX-512, 0.83-0.84x on AVX2 and 0.91x on the
// portable variant at batch 1024, 0.97-1.0x, 0.90-0.93x and 0.93-0.97x at
// batch 256 (two slices); equal bit for bit; batch 1024 of 4096 inputs and
// units then takes 4 MiB of scratch instead of 32. Work is
// split over the nonzeros on TensorFlow's intra-op thread pool. The
// pure-TensorFlow fallback in tfsparse/ops/sddmm.py computes the same sums
// (in another order). The dot product (sddmm_variant.inc) is
// compiled once per instruction-set variant; the op's "isa" attribute picks
// one (isa.h).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "blocks.h"
#include "cache_size.h"
#include "isa.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TfsparseSddmm")
    .Input("x_t: T")
    .Input("dy_t: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Output("out: T")
    .Attr("T: {float, double}")
    .Attr("isa: string = ''")
    .Attr("batch_major: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &rows));
      c->set_output(0, rows);
      return absl::OkStatus();
    });

#define TFSPARSE_VARIANT_SOURCE "sddmm_variant.inc"
#include "variants.inc"

namespace {

using tfsparse::Isa;

// Products of up to this cost (about cycles: 2 * batch + 8 per nonzero) run
// on the calling thread: waking a pool thread would cost more.
constexpr int64_t kInlineCost = int64_t{1} << 16;

template <typename T>
void RunSddmm(Isa isa, const T* x, const T* dy, const int32_t* rows,
              const int32_t* cols, int64_t begin, int64_t end, int64_t batch,
              bool accumulate, bool prefetch_x, T* out) {
  TFSPARSE_DISPATCH(isa, Sddmm<T>, x, dy, rows, cols, begin, end, batch,
                    accumulate, prefetch_x, out);
}

// The rows of the batch in a slice of batch-major inputs: x's rows of a
// slice ([n_in, slice]) take at most kSliceBytes, so the random reads of
// them can stay in a core's L2 (the SDDMM on a 4 MiB x took 3.2x the time
// of one on 2 MiB, twice the rows, on this project's CPUs with 2 MiB of
// L2). At least 16 rows. A constant, not the CPU's L2: results then do not
// depend on the machine. Against 1 MiB here (transposes and SDDMM alone,
// batch 256-1024): 0.89-0.97x the time on AVX-512 and AVX2, 1.07-1.12x on
// the portable variant. Against no slices: 0.66-0.82x on AVX-512 and AVX2,
// 0.86-0.97x on the portable variant (same-process, 2 cores, medians).
constexpr int64_t kSliceBytes = int64_t{1} << 21;

int64_t SliceRows(int64_t batch, int64_t n_in, int64_t element_bytes) {
  const int64_t fits = kSliceBytes / std::max<int64_t>(1, n_in * element_bytes);
  if (fits >= batch) return std::max<int64_t>(1, batch);  // x: up to 2 MiB
  const int64_t rows = std::max<int64_t>(16, fits / 16 * 16);
  if (rows >= batch) return batch;
  // Equal slices, each a multiple of 16 rows where the batch allows.
  const int64_t slices = (batch + rows - 1) / rows;
  return ((batch + slices - 1) / slices + 15) / 16 * 16;
}

template <typename T>
void RunTransposeColumns(Isa isa, const T* src, int64_t rows, int64_t cols,
                         int64_t c_begin, int64_t c_end, T* dst) {
  TFSPARSE_DISPATCH(isa, TransposeColumns<T>, src, rows, cols, c_begin, c_end,
                    dst);
}

uint32_t RunMaxIndex(Isa isa, const int32_t* idx, int64_t n) {
  TFSPARSE_DISPATCH(isa, MaxIndex, idx, n);
}

template <typename T>
class SddmmOp : public OpKernel {
 public:
  explicit SddmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, tfsparse::IsaFromAttr(ctx, &isa_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("batch_major", &batch_major_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& dy_t = ctx->input(1);
    const Tensor& rows = ctx->input(2);
    const Tensor& cols = ctx->input(3);
    OP_REQUIRES(ctx, x_t.dims() == 2 && dy_t.dims() == 2,
                errors::InvalidArgument("x_t and dy_t must be 2-D, got ranks ",
                                        x_t.dims(), " and ", dy_t.dims()));
    const int batch_dim = batch_major_ ? 0 : 1;
    OP_REQUIRES(ctx, x_t.dim_size(batch_dim) == dy_t.dim_size(batch_dim),
                errors::InvalidArgument(
                    "x_t and dy_t must have the same batch (",
                    batch_major_ ? "first" : "second", ") dimension, got ",
                    x_t.dim_size(batch_dim), " and ",
                    dy_t.dim_size(batch_dim)));
    OP_REQUIRES(ctx, rows.dims() == 1 && cols.dims() == 1 &&
                         rows.dim_size(0) == cols.dim_size(0),
                errors::InvalidArgument(
                    "rows and cols must be 1-D of equal length"));
    const int64_t nnz = rows.dim_size(0);
    const int64_t n_in = x_t.dim_size(1 - batch_dim);
    const int64_t n_out = dy_t.dim_size(1 - batch_dim);
    const int64_t batch = x_t.dim_size(batch_dim);
    const int32_t* r = rows.flat<int32_t>().data();
    const int32_t* c = cols.flat<int32_t>().data();
    // Vectorized max reductions (a negative index read as uint32 wraps
    // above any limit); the loop that names the culprit runs only when they
    // find one.
    if (nnz > 0 && (int64_t{RunMaxIndex(isa_, r, nnz)} >= n_in ||
                    int64_t{RunMaxIndex(isa_, c, nnz)} >= n_out)) {
      for (int64_t k = 0; k < nnz; ++k) {
        OP_REQUIRES(
            ctx, r[k] >= 0 && r[k] < n_in && c[k] >= 0 && c[k] < n_out,
            errors::InvalidArgument("nonzero ", k, " at (", r[k], ", ", c[k],
                                    ") is outside the kernel of shape (",
                                    n_in, ", ", n_out, ")"));
      }
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, rows.shape(), &out));
    const T* x = x_t.flat<T>().data();
    const T* dy = dy_t.flat<T>().data();
    T* o = out->flat<T>().data();
    if (batch == 0) {  // sums of no terms
      std::fill(o, o + nnz, T(0));
      return;
    }
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    // Batch-major inputs are taken in slices of `slice` rows of the batch,
    // summed slice after slice (each adds to `out`); transposed ones are
    // one slice. Each slice of x and dy is transposed ([n_in, slice] and
    // [n_out, slice]) into one pair of buffers, just before its products,
    // which then read it from cache.
    const int64_t slice = batch_major_ ? SliceRows(batch, n_in, sizeof(T)) : batch;
    const bool transpose = batch_major_ && nnz > 0;
    Tensor x_rows, dy_rows;
    if (transpose) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DataTypeToEnum<T>::value,
                                             TensorShape({n_in, slice}),
                                             &x_rows));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DataTypeToEnum<T>::value,
                                             TensorShape({n_out, slice}),
                                             &dy_rows));
    }
    for (int64_t b0 = 0; b0 < batch; b0 += slice) {
      const int64_t rows_in_slice = std::min(slice, batch - b0);
      const T* x_slice = x + b0 * n_in;
      const T* dy_slice = dy + b0 * n_out;
      if (transpose) {
        T* x_out = x_rows.flat<T>().data();
        T* dy_out = dy_rows.flat<T>().data();
        // Columns [0, n_in) are x's, [n_in, n_in + n_out) dy's; blocks of
        // whole 64-column tiles (TransposeColumns), taken by the calling
        // thread and the pool's (about a cycle an element: the threshold
        // of the product's own split).
        const int64_t columns = n_in + n_out;
        const int64_t threads =
            rows_in_slice * columns <= kInlineCost ? 1 : workers.num_threads;
        const int64_t block =
            (tfsparse::Blocks::SizeFor(columns, threads, 4) + 63) / 64 * 64;
        tfsparse::Blocks::RunRanges(
            *workers.workers, threads, columns, block,
            tfsparse::Scheduling::kFromTasks, [&](int64_t begin, int64_t end) {
              if (begin < n_in) {
                RunTransposeColumns<T>(isa_, x_slice, rows_in_slice, n_in,
                                       begin, std::min(end, n_in), x_out);
              }
              if (end > n_in) {
                RunTransposeColumns<T>(isa_, dy_slice, rows_in_slice, n_out,
                                       std::max(begin, n_in) - n_in,
                                       end - n_in, dy_out);
              }
            });
        x_slice = x_out;
        dy_slice = dy_out;
      }
      // Blocks of nonzeros taken one at a time by the calling thread and
      // the pool's (Blocks); a product too small to pay for waking a
      // thread runs on the calling thread.
      // Rows of x read at random: prefetched ahead (on some variants,
      // sddmm_variant.inc) when the slice of x takes more than half of L2.
      // Speed only: the sums are the same either way.
      const bool prefetch_x = n_in * rows_in_slice * int64_t{sizeof(T)} >
                              tfsparse::L2CacheBytes() / 2;
      auto work = [&](int64_t begin, int64_t end) {
        RunSddmm<T>(isa_, x_slice, dy_slice, r, c, begin, end, rows_in_slice,
                    b0 > 0, prefetch_x, o);
      };
      const int64_t threads = nnz * (2 * rows_in_slice + 8) <= kInlineCost
                                  ? 1
                                  : workers.num_threads;
      tfsparse::Blocks::RunRanges(*workers.workers, threads, nnz,
                                  tfsparse::Blocks::SizeFor(nnz, threads, 8),
                                  tfsparse::Scheduling::kFromTasks, work);
    }
  }

 private:
  Isa isa_;
  bool batch_major_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSddmm").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SddmmOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSddmm").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SddmmOp<double>);
