// TfsparseSpmm: a dense matrix times a sparse one, in segment (CSC) form.
//
//   y[b, j] = bias[j] + sum_{k : seg[k] == j} x[b, idx[k]] * values[k]
//
// The nonzeros are sorted by their output index `seg`; the segment pointers
// are built here in one pass (no separate op per call). `bias` may be empty
// (no bias); adding it here saves the pass over the output that
// tf.nn.bias_add would make, as Grappler's fused MatMul + BiasAdd does for
// Dense. With the kernel's column-major pattern (idx = input of each nonzero,
// seg = its column) this is the forward product x @ W; with the row-major
// pattern (idx = output, seg = row) it is the input gradient dy @ W^T.
// `order` may name that permutation instead (empty: none): the op then uses
// the nonzeros values[order[k]], idx[order[k]], seg[order[k]] for k = 0 ..
// nnz - 1, copied into place in one pass here, so the input gradient takes the
// column-major pattern and W's row-major order as they are (three tf.gather
// ops took about twice as long as this pass).
//
// The compute code (spmm_variant.inc) is compiled once per instruction-set
// variant (variants.inc); the op's "isa" attribute picks one (isa.h).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "isa.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TfsparseSpmm")
    .Input("x: T")
    .Input("values: T")
    .Input("idx: int32")
    .Input("seg: int32")
    .Input("bias: T")
    .Input("order: int32")
    .Output("y: T")
    .Attr("T: {float, double}")
    .Attr("units: int >= 0")
    .Attr("isa: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      int64_t units;
      TF_RETURN_IF_ERROR(c->GetAttr("units", &units));
      c->set_output(0, c->Matrix(c->Dim(x, 0), units));
      return absl::OkStatus();
    });

#define TFSPARSE_VARIANT_SOURCE "spmm_variant.inc"
#include "variants.inc"

namespace {

using tfsparse::Isa;

template <typename T>
void RunSpmm(Isa isa, OpKernelContext* ctx, const T* x, const T* values,
             const int32_t* idx, const int64_t* ptr, const T* bias,
             int64_t batch, int64_t n_in, int64_t units, int64_t nnz, T* y) {
  TFSPARSE_DISPATCH(isa, Spmm<T>, ctx, x, values, idx, ptr, bias, batch, n_in,
                    units, nnz, y);
}

bool RunSegmentPointers(Isa isa, const int32_t* seg, int64_t nnz,
                        int64_t units, int64_t* ptr) {
  TFSPARSE_DISPATCH(isa, SegmentPointers, seg, nnz, units, ptr);
}

uint32_t RunMaxIndex(Isa isa, const int32_t* idx, int64_t nnz) {
  TFSPARSE_DISPATCH(isa, MaxIndex, idx, nnz);
}

// OK when every one of the n entries of `index` (the input called `name`) is
// in [0, limit). A vectorized max over them read as uint32 (a negative index
// wraps above any limit; int32 indices cannot reach 2^32 - 1); the loop that
// names the culprit runs only when it fails.
absl::Status CheckIndices(Isa isa, const char* name, const int32_t* index,
                          int64_t n, int64_t limit) {
  if (n == 0 || int64_t{RunMaxIndex(isa, index, n)} < limit) {
    return absl::OkStatus();
  }
  for (int64_t k = 0; k < n; ++k) {
    if (index[k] < 0 || index[k] >= limit) {
      return errors::InvalidArgument(name, "[", k, "]=", index[k],
                                     " is outside [0, ", limit, ")");
    }
  }
  return absl::OkStatus();
}

// Shard's cost of gathering one nonzero's value, idx and seg in `order`:
// three random reads from arrays in L2 or L3 (131072 nonzeros: 0.28 ms on
// one core here, 2 ns each), so large layers use every thread.
constexpr int64_t kGatherCost = 30;

template <typename T>
class SpmmOp : public OpKernel {
 public:
  explicit SpmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("units", &units_));
    OP_REQUIRES_OK(ctx, tfsparse::IsaFromAttr(ctx, &isa_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_tensor = ctx->input(0);
    const Tensor& values_tensor = ctx->input(1);
    const Tensor& idx_tensor = ctx->input(2);
    const Tensor& seg_tensor = ctx->input(3);
    const Tensor& bias_tensor = ctx->input(4);
    const Tensor& order_tensor = ctx->input(5);
    OP_REQUIRES(ctx, x_tensor.dims() == 2,
                errors::InvalidArgument("x must be 2-D, got rank ",
                                        x_tensor.dims()));
    const int64_t batch = x_tensor.dim_size(0);
    const int64_t n_in = x_tensor.dim_size(1);
    const int64_t units = units_;
    const int64_t nnz = idx_tensor.NumElements();
    OP_REQUIRES(ctx, values_tensor.NumElements() == nnz &&
                         seg_tensor.NumElements() == nnz,
                errors::InvalidArgument(
                    "values, idx and seg differ in length: ",
                    values_tensor.NumElements(), ", ", nnz, " and ",
                    seg_tensor.NumElements()));
    OP_REQUIRES(ctx, bias_tensor.dims() == 1 &&
                         (bias_tensor.dim_size(0) == 0 ||
                          bias_tensor.dim_size(0) == units),
                errors::InvalidArgument("bias must be empty or of length ",
                                        units, ", got shape ",
                                        bias_tensor.shape().DebugString()));
    const int64_t order_size = order_tensor.NumElements();
    OP_REQUIRES(ctx, order_size == 0 || order_size == nnz,
                errors::InvalidArgument("order must be empty or of length nnz=",
                                        nnz, ", got ", order_size));
    const T* values = values_tensor.flat<T>().data();
    const int32_t* idx = idx_tensor.flat<int32_t>().data();
    const int32_t* seg = seg_tensor.flat<int32_t>().data();
    Tensor values_in_order, idx_in_order, seg_in_order;
    if (order_size > 0) {
      const int32_t* order = order_tensor.flat<int32_t>().data();
      OP_REQUIRES_OK(ctx, CheckIndices(isa_, "order", order, nnz, nnz));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DataTypeToEnum<T>::value,
                                             TensorShape({nnz}),
                                             &values_in_order));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({nnz}),
                                             &idx_in_order));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({nnz}),
                                             &seg_in_order));
      T* values_out = values_in_order.flat<T>().data();
      int32_t* idx_out = idx_in_order.flat<int32_t>().data();
      int32_t* seg_out = seg_in_order.flat<int32_t>().data();
      // Random reads (the order is a permutation), split over the intra-op
      // pool: each thread gathers a range of k.
      const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
      Shard(workers.num_threads, workers.workers, nnz,
            /*cost_per_unit=*/kGatherCost, [&](int64_t begin, int64_t end) {
              for (int64_t k = begin; k < end; ++k) {
                const int32_t from = order[k];
                values_out[k] = values[from];
                idx_out[k] = idx[from];
                seg_out[k] = seg[from];
              }
            });
      values = values_out;
      idx = idx_out;
      seg = seg_out;
    }
    std::vector<int64_t> ptr(units + 1);
    OP_REQUIRES(ctx, RunSegmentPointers(isa_, seg, nnz, units, ptr.data()),
                errors::InvalidArgument("seg (taken in `order`, if given) must "
                                        "be sorted and in [0, units=",
                                        units, ")"));
    OP_REQUIRES_OK(ctx, CheckIndices(isa_, "idx", idx, nnz, n_in));
    Tensor* y_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, units}), &y_tensor));
    if (batch == 0 || units == 0) return;
    const T* bias =
        bias_tensor.NumElements() == 0 ? nullptr : bias_tensor.flat<T>().data();
    RunSpmm<T>(isa_, ctx, x_tensor.flat<T>().data(), values, idx, ptr.data(),
               bias, batch, n_in, units, nnz, y_tensor->flat<T>().data());
  }

 private:
  int64_t units_;
  Isa isa_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SpmmOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SpmmOp<double>);
