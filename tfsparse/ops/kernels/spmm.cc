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
// nnz - 1, so the input gradient takes the column-major pattern and W's
// row-major order as they are (three tf.gather ops took about twice as long
// as one pass here). The values are gathered on every call; the permuted,
// validated pattern is kept while (order, idx, seg) stay the same
// (ordered_pattern.h).
//
// The compute code (spmm_variant.inc) is compiled once per instruction-set
// variant (variants.inc); the op's "isa" attribute picks one (isa.h).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "blocks.h"
#include "cache_size.h"
#include "isa.h"
#include "ordered_pattern.h"

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

// Up to this many nonzeros the passes over `order` run on the calling
// thread. Measured here (2 cores, the input gradient of a layer with 32
// nonzeros per column, batch 8 and 256): with 131072 nonzeros the comparison
// and gather took 0.21-0.24 ms on one thread and 0.24-0.37 ms split over the
// pool; with 1048576 nonzeros 3.2-3.5 ms on one thread and 2.0-2.1 ms split.
constexpr int64_t kInlineOrderedNonzeros = int64_t{1} << 18;

// Runs pass(begin, end) over [0, nnz), a pass over `order`: on the calling
// thread up to kInlineOrderedNonzeros, else split over it and the pool's
// threads (Blocks).
void OrderedPass(const DeviceBase::CpuWorkerThreads& workers, int64_t nnz,
                 const std::function<void(int64_t, int64_t)>& pass) {
  const int64_t threads =
      nnz <= kInlineOrderedNonzeros ? 1 : workers.num_threads;
  tfsparse::Blocks::RunRanges(*workers.workers, threads, nnz,
                              tfsparse::Blocks::SizeFor(nnz, threads, 4),
                              tfsparse::Scheduling::kFromTasks, pass);
}

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
    Tensor values_in_order;
    std::shared_ptr<const tfsparse::OrderedPattern> ordered;
    std::vector<int64_t> own_ptr;
    const int64_t* ptr = nullptr;
    if (order_size > 0) {
      const int32_t* order = order_tensor.flat<int32_t>().data();
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DataTypeToEnum<T>::value,
                                             TensorShape({nnz}),
                                             &values_in_order));
      T* values_out = values_in_order.flat<T>().data();
      const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
      // The values change every step: gathered on every call (random reads).
      auto gather_values = [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) values_out[k] = values[order[k]];
      };
      // One parallel pass: each thread compares its range of the inputs
      // with the kept pattern's and, where they match (so `order` there is
      // the validated one), gathers the values.
      ordered = ordered_patterns_.Candidate(order, idx, seg, nnz);
      std::atomic<bool> matches{ordered != nullptr};
      if (ordered != nullptr) {
        OrderedPass(workers, nnz, [&](int64_t begin, int64_t end) {
          if (!ordered->MadeFrom(order, idx, seg, begin, end)) {
            matches = false;
            return;
          }
          gather_values(begin, end);
        });
      }
      if (matches) {
        ordered_patterns_.Used(ordered.get());
      } else {
        OP_REQUIRES_OK(ctx, CheckIndices(isa_, "order", order, nnz, nnz));
        auto made = std::make_shared<tfsparse::OrderedPattern>();
        OP_REQUIRES_OK(ctx, Permute(ctx, order, idx, seg, nnz, units, made.get()));
        ordered = std::move(made);
        ordered_patterns_.Keep(ordered);
        OrderedPass(workers, nnz, gather_values);
      }
      if (int64_t{ordered->max_idx} >= n_in) {  // only x's width can differ
        OP_REQUIRES_OK(ctx, CheckIndices(isa_, "idx (taken in `order`)",
                                         ordered->idx_in_order.data(), nnz,
                                         n_in));
      }
      values = values_out;
      idx = ordered->idx_in_order.data();
      ptr = ordered->ptr.data();
    } else {
      own_ptr.resize(units + 1);
      OP_REQUIRES(ctx, RunSegmentPointers(isa_, seg, nnz, units, own_ptr.data()),
                  errors::InvalidArgument("seg must be sorted and in [0, units=",
                                          units, ")"));
      OP_REQUIRES_OK(ctx, CheckIndices(isa_, "idx", idx, nnz, n_in));
      ptr = own_ptr.data();
    }
    Tensor* y_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, units}), &y_tensor));
    if (batch == 0 || units == 0) return;
    const T* bias =
        bias_tensor.NumElements() == 0 ? nullptr : bias_tensor.flat<T>().data();
    RunSpmm<T>(isa_, ctx, x_tensor.flat<T>().data(), values, idx, ptr,
               bias, batch, n_in, units, nnz, y_tensor->flat<T>().data());
  }

 private:
  // `made` = the pattern (idx, seg) taken in `order` (entries in [0, nnz)),
  // its segment pointers and its largest index; an error unless seg in
  // `order` is sorted and in [0, units).
  absl::Status Permute(OpKernelContext* ctx, const int32_t* order,
                       const int32_t* idx, const int32_t* seg, int64_t nnz,
                       int64_t units, tfsparse::OrderedPattern* made) const {
    made->order.assign(order, order + nnz);
    made->idx.assign(idx, idx + nnz);
    made->seg.assign(seg, seg + nnz);
    made->idx_in_order.resize(nnz);
    std::vector<int32_t> seg_in_order(nnz);
    int32_t* idx_out = made->idx_in_order.data();
    int32_t* seg_out = seg_in_order.data();
    // Random reads (the order is a permutation); each thread gathers a
    // range of k.
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    OrderedPass(workers, nnz, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        idx_out[k] = idx[order[k]];
        seg_out[k] = seg[order[k]];
      }
    });
    made->ptr.resize(units + 1);
    if (!RunSegmentPointers(isa_, seg_out, nnz, units, made->ptr.data())) {
      return errors::InvalidArgument(
          "seg taken in `order` must be sorted and in [0, units=", units, ")");
    }
    made->max_idx = RunMaxIndex(isa_, idx_out, nnz);
    return absl::OkStatus();
  }

  int64_t units_;
  Isa isa_;
  tfsparse::OrderedPatternCache ordered_patterns_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SpmmOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SpmmOp<double>);
