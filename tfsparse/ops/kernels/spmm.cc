// TfsparseSpmm: a dense matrix times a sparse one, in segment (CSC) form.
//
//   y[b, j] = sum_{k = ptr[j]}^{ptr[j+1]-1} x[b, idx[k]] * values[k]
//
// With the kernel's column-major pattern (idx = input of each nonzero, ptr =
// column pointer) this is the forward product x @ W; with the row-major
// pattern (idx = output, ptr = row pointer) it is the input gradient dy @ W^T.
//
// The batch is processed in panels of P rows: a panel of x is copied
// transposed ([n_in][P], contiguous per input), so each nonzero costs one
// vector load and multiply-add for P = 8 batch rows at once, with the 8
// accumulators in one register (wider panels spill them and run 3-6x slower).
// Work units are (panel, range of output columns) pairs on TF's intra-op pool.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TfsparseSpmm")
    .Input("x: T")
    .Input("values: T")
    .Input("idx: int32")
    .Input("ptr: int64")
    .Output("y: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x, ptr;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &ptr));
      shape_inference::DimensionHandle units;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(ptr, 0), 1, &units));
      c->set_output(0, c->Matrix(c->Dim(x, 0), units));
      return absl::OkStatus();
    });

namespace {

constexpr int64_t kTile = 16;

template <typename T, int64_t kPanel>
void SpmmPanels(OpKernelContext* ctx, const T* x, const T* values,
                const int32_t* idx, const int64_t* ptr, int64_t batch,
                int64_t n_in, int64_t units, int64_t nnz, T* y) {
  const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t panels = (batch + kPanel - 1) / kPanel;
  // Enough work units for every thread, split over columns when the batch
  // has few panels.
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>(units, (4 * workers.num_threads + panels - 1) /
                                      panels));
  const int64_t chunk_units = (units + chunks - 1) / chunks;

  auto work = [&](int64_t begin, int64_t end) {
    std::vector<T> panel(n_in * kPanel);
    int64_t panel_in_buffer = -1;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t p = unit / chunks;
      const int64_t b0 = p * kPanel;
      const int64_t rows = std::min(kPanel, batch - b0);
      if (p != panel_in_buffer) {
        if (rows < kPanel) std::fill(panel.begin(), panel.end(), T(0));
        for (int64_t r = 0; r < rows; ++r) {
          const T* src = x + (b0 + r) * n_in;
          for (int64_t i = 0; i < n_in; ++i) panel[i * kPanel + r] = src[i];
        }
        panel_in_buffer = p;
      }
      const int64_t j_begin = (unit % chunks) * chunk_units;
      const int64_t j_end = std::min(units, j_begin + chunk_units);
      // Results of kTile consecutive columns are gathered in `tile` and then
      // written row by row, one cache line each: storing them column by
      // column would touch P rows units*sizeof(T) bytes apart, which alias to
      // the same cache set.
      for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
        const int64_t width = std::min(kTile, j_end - j0);
        T tile[kTile][kPanel];
        for (int64_t t = 0; t < width; ++t) {
          const int64_t j = j0 + t;
          T acc[kPanel] = {};
          for (int64_t k = ptr[j]; k < ptr[j + 1]; ++k) {
            const T v = values[k];
            const T* column = panel.data() + int64_t{idx[k]} * kPanel;
#pragma omp simd
            for (int64_t r = 0; r < kPanel; ++r) acc[r] += v * column[r];
          }
          for (int64_t r = 0; r < kPanel; ++r) tile[t][r] = acc[r];
        }
        for (int64_t r = 0; r < rows; ++r) {
          T* out = y + (b0 + r) * units + j0;
          for (int64_t t = 0; t < width; ++t) out[t] = tile[t][r];
        }
      }
    }
  };
  const int64_t nnz_per_unit =
      std::max<int64_t>(1, nnz / units) * chunk_units;
  Shard(workers.num_threads, workers.workers, panels * chunks,
        /*cost_per_unit=*/kPanel * (2 * nnz_per_unit + n_in / chunks + 1),
        work);
}

template <typename T>
class SpmmOp : public OpKernel {
 public:
  explicit SpmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_tensor = ctx->input(0);
    const Tensor& values_tensor = ctx->input(1);
    const Tensor& idx_tensor = ctx->input(2);
    const Tensor& ptr_tensor = ctx->input(3);
    OP_REQUIRES(ctx, x_tensor.dims() == 2,
                errors::InvalidArgument("x must be 2-D, got rank ",
                                        x_tensor.dims()));
    OP_REQUIRES(ctx, ptr_tensor.dims() == 1 && ptr_tensor.dim_size(0) >= 1,
                errors::InvalidArgument("ptr must be 1-D and non-empty"));
    const int64_t batch = x_tensor.dim_size(0);
    const int64_t n_in = x_tensor.dim_size(1);
    const int64_t units = ptr_tensor.dim_size(0) - 1;
    const int64_t nnz = idx_tensor.NumElements();
    OP_REQUIRES(ctx, values_tensor.NumElements() == nnz,
                errors::InvalidArgument("values and idx differ in length: ",
                                        values_tensor.NumElements(), " and ",
                                        nnz));
    const int32_t* idx = idx_tensor.flat<int32_t>().data();
    const int64_t* ptr = ptr_tensor.flat<int64_t>().data();
    OP_REQUIRES(ctx, ptr[0] == 0 && ptr[units] == nnz,
                errors::InvalidArgument("ptr must run from 0 to nnz=", nnz));
    for (int64_t j = 0; j < units; ++j) {
      OP_REQUIRES(ctx, ptr[j] <= ptr[j + 1],
                  errors::InvalidArgument("ptr must be non-decreasing"));
    }
    for (int64_t k = 0; k < nnz; ++k) {
      OP_REQUIRES(ctx, idx[k] >= 0 && idx[k] < n_in,
                  errors::InvalidArgument("idx[", k, "]=", idx[k],
                                          " is outside [0, ", n_in, ")"));
    }
    Tensor* y_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, units}), &y_tensor));
    if (batch == 0 || units == 0) return;
    const T* x = x_tensor.flat<T>().data();
    const T* values = values_tensor.flat<T>().data();
    T* y = y_tensor->flat<T>().data();

    SpmmPanels<T, 8>(ctx, x, values, idx, ptr, batch, n_in, units, nnz, y);
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SpmmOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SpmmOp<double>);
