// Direct sparse 2-D convolution on the kernel's nonzeros (tfsparse/ops/conv.py).
//
// The kernel (kh, kw, C, F) is given as its im2col matrix's nonzeros: row
// r = (i * kw + j) * C + c, column f, value v. Tensors are planar ("NCHW"):
//
//   TfsparseSparseConvForward        xp [B, C, Hp, Wp] -> y [B, F, OH, OW]
//   TfsparseSparseConvBackpropInput  dy [B, F, OH, OW] -> dxp [B, C, Hp, Wp]
//   TfsparseSparseConvBackpropValues xp, dy           -> dv [nnz]
//
// xp is the input already padded (Python pads as Conv2D's "same"), so
// OH = (Hp - (kh - 1) * dh - 1) / sh + 1 and likewise OW. Each nonzero is an
// axpy (or dot product) of whole output rows against a shifted input row: no
// dense kernel and no im2col buffer are allocated; each thread has one
// image's worth of output rows [F, OH, Wp] as scratch (stride 1: one long
// contiguous loop per nonzero, sparse_conv_variant.inc), and the values
// gradient a [threads, nnz] partial-sum buffer. Work is split over images
// (the values gradient: over groups of images, summed at the end) on
// TensorFlow's intra-op pool; the row loops (sparse_conv_variant.inc) are
// compiled once per instruction-set variant and chosen by the "isa" attribute.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "isa.h"

using namespace tensorflow;  // NOLINT

struct ConvGeometry {
  int64_t channels, height, width;  // of the padded input plane set
  int64_t filters, out_h, out_w;
  int64_t stride_h, stride_w;
};

template <typename T>
struct ConvNonzero {
  int64_t x_offset;  // of the tap's first input element in [C, Hp, Wp]
  int64_t filter;
  T value;
};

#define TFSPARSE_VARIANT_SOURCE "sparse_conv_variant.inc"
#include "variants.inc"

namespace {

using tfsparse::Isa;

// One image of each pass on the variant `isa` (TFSPARSE_DISPATCH returns).
template <typename T>
void RunForward(Isa isa, const T* xp, const ConvNonzero<T>* nz, int64_t nnz,
                const ConvGeometry& g, T* wide, T* y) {
  TFSPARSE_DISPATCH(isa, ConvForwardImage<T>, xp, nz, nnz, g, wide, y);
}

template <typename T>
void RunBackpropInput(Isa isa, const T* dy, const ConvNonzero<T>* nz, int64_t nnz,
                      const ConvGeometry& g, T* wide, T* dxp) {
  TFSPARSE_DISPATCH(isa, ConvBackpropInputImage<T>, dy, nz, nnz, g, wide, dxp);
}

template <typename T>
void RunBackpropValues(Isa isa, const T* xp, const T* dy, const ConvNonzero<T>* nz,
                       int64_t nnz, const ConvGeometry& g, T* wide, T* dv) {
  TFSPARSE_DISPATCH(isa, ConvBackpropValuesImage<T>, xp, dy, nz, nnz, g, wide, dv);
}

#define TFSPARSE_CONV_ATTRS                     \
  Attr("T: {float, double}")                    \
      .Attr("filters: int >= 1")                \
      .Attr("kernel_size: list(int) >= 2")      \
      .Attr("strides: list(int) >= 2")          \
      .Attr("dilations: list(int) >= 2")        \
      .Attr("isa: string = ''")

REGISTER_OP("TfsparseSparseConvForward")
    .Input("xp: T")
    .Input("values: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Output("y: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn(shape_inference::UnknownShape);

REGISTER_OP("TfsparseSparseConvBackpropInput")
    .Input("dy: T")
    .Input("values: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Input("padded_shape: int32")
    .Output("dxp: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn(shape_inference::UnknownShape);

REGISTER_OP("TfsparseSparseConvBackpropValues")
    .Input("xp: T")
    .Input("dy: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Output("dv: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(2));
      return absl::OkStatus();
    });

enum class Pass { kForward, kBackpropInput, kBackpropValues };

absl::Status CheckDy(const Tensor& dy, int64_t batch, const ConvGeometry& g) {
  if (dy.dims() == 4 && dy.dim_size(0) == batch && dy.dim_size(1) == g.filters &&
      dy.dim_size(2) == g.out_h && dy.dim_size(3) == g.out_w) {
    return absl::OkStatus();
  }
  return errors::InvalidArgument("dy must be [", batch, ", ", g.filters, ", ", g.out_h,
                                 ", ", g.out_w, "], got ", dy.shape().DebugString());
}

template <typename T>
class SparseConvOp : public OpKernel {
 public:
  explicit SparseConvOp(OpKernelConstruction* ctx, Pass pass)
      : OpKernel(ctx), pass_(pass) {
    OP_REQUIRES_OK(ctx, tfsparse::IsaFromAttr(ctx, &isa_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filters", &filters_));
    for (const char* name : {"kernel_size", "strides", "dilations"}) {
      std::vector<int32> pair;
      OP_REQUIRES_OK(ctx, ctx->GetAttr(name, &pair));
      OP_REQUIRES(ctx, pair.size() == 2 && pair[0] >= 1 && pair[1] >= 1,
                  errors::InvalidArgument(name, " must be two positive ints"));
      pairs_.push_back(pair);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    // The padded input's shape: xp's, or given to the input gradient.
    int64_t shape[4];
    if (pass_ == Pass::kBackpropInput) {
      const Tensor& s = ctx->input(4);
      OP_REQUIRES(ctx, s.NumElements() == 4,
                  errors::InvalidArgument("padded_shape must have 4 elements"));
      for (int d = 0; d < 4; ++d) shape[d] = s.flat<int32>()(d);
    } else {
      OP_REQUIRES(ctx, ctx->input(0).dims() == 4,
                  errors::InvalidArgument("xp must be 4-D [B, C, Hp, Wp]"));
      for (int d = 0; d < 4; ++d) shape[d] = ctx->input(0).dim_size(d);
    }
    const int64_t batch = shape[0];
    ConvGeometry g;
    g.channels = shape[1];
    g.height = shape[2];
    g.width = shape[3];
    g.filters = filters_;
    g.stride_h = pairs_[1][0];
    g.stride_w = pairs_[1][1];
    const int64_t extent_h = (pairs_[0][0] - 1) * int64_t{pairs_[2][0]} + 1;
    const int64_t extent_w = (pairs_[0][1] - 1) * int64_t{pairs_[2][1]} + 1;
    g.out_h = g.height >= extent_h ? (g.height - extent_h) / g.stride_h + 1 : 0;
    g.out_w = g.width >= extent_w ? (g.width - extent_w) / g.stride_w + 1 : 0;
    std::vector<ConvNonzero<T>> nz;
    OP_REQUIRES_OK(ctx, Nonzeros(ctx, g, &nz));
    const int64_t nnz = nz.size();
    const int64_t x_size = g.channels * g.height * g.width;
    const int64_t y_size = g.filters * g.out_h * g.out_w;
    const int64_t cost = 2 * std::max<int64_t>(nnz, 1) * g.out_h * g.out_w + x_size + y_size;
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    if (pass_ != Pass::kForward) {
      OP_REQUIRES_OK(ctx, CheckDy(ctx->input(pass_ == Pass::kBackpropValues ? 1 : 0),
                                  batch, g));
    }
    if (pass_ == Pass::kBackpropValues) {
      const Tensor& dy = ctx->input(1);
      Tensor* dv = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({nnz}), &dv));
      const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(batch, workers.num_threads));
      std::vector<T> partial(groups * nnz, T(0));
      const T* x = ctx->input(0).flat<T>().data();
      const T* e = dy.flat<T>().data();
      auto work = [&](int64_t begin, int64_t end) {
        std::vector<T> wide(g.filters * g.out_h * g.width);
        for (int64_t group = begin; group < end; ++group) {
          for (int64_t b = group * batch / groups; b < (group + 1) * batch / groups; ++b) {
            RunBackpropValues<T>(isa_, x + b * x_size, e + b * y_size, nz.data(), nnz,
                                 g, wide.data(), partial.data() + group * nnz);
          }
        }
      };
      Shard(workers.num_threads, workers.workers, groups, cost * (batch / groups + 1), work);
      T* out = dv->flat<T>().data();
      for (int64_t k = 0; k < nnz; ++k) {
        T sum = 0;
        for (int64_t group = 0; group < groups; ++group) sum += partial[group * nnz + k];
        out[k] = sum;
      }
      return;
    }
    const bool forward = pass_ == Pass::kForward;
    const Tensor& in = ctx->input(0);
    Tensor* out = nullptr;
    TensorShape out_shape = forward
        ? TensorShape({batch, g.filters, g.out_h, g.out_w})
        : TensorShape({batch, g.channels, g.height, g.width});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    const T* src = in.flat<T>().data();
    T* dst = out->flat<T>().data();
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<T> wide(g.filters * g.out_h * g.width);  // per call: threads share none
      for (int64_t b = begin; b < end; ++b) {
        if (forward) {
          RunForward<T>(isa_, src + b * x_size, nz.data(), nnz, g, wide.data(),
                        dst + b * y_size);
        } else {
          RunBackpropInput<T>(isa_, src + b * y_size, nz.data(), nnz, g, wide.data(),
                              dst + b * x_size);
        }
      }
    };
    Shard(workers.num_threads, workers.workers, batch, cost, work);
  }

 private:
  // The nonzeros with their input offsets, checked against the geometry.
  absl::Status Nonzeros(OpKernelContext* ctx, const ConvGeometry& g,
                        std::vector<ConvNonzero<T>>* nz) {
    const Tensor& values = ctx->input(pass_ == Pass::kBackpropValues ? 2 : 1);
    const Tensor& rows = ctx->input(2);
    const Tensor& cols = ctx->input(3);
    const int64_t nnz = rows.NumElements();
    if (rows.dims() != 1 || cols.dims() != 1 || cols.NumElements() != nnz ||
        (pass_ != Pass::kBackpropValues && values.NumElements() != nnz)) {
      return errors::InvalidArgument("values, rows and cols must be 1-D of equal length");
    }
    const int64_t kh = pairs_[0][0], kw = pairs_[0][1];
    const int64_t rows_total = kh * kw * g.channels;
    const int32* r = rows.flat<int32>().data();
    const int32* c = cols.flat<int32>().data();
    nz->resize(nnz);
    for (int64_t k = 0; k < nnz; ++k) {
      if (r[k] < 0 || r[k] >= rows_total || c[k] < 0 || c[k] >= g.filters) {
        return errors::InvalidArgument("nonzero ", k, " at (", r[k], ", ", c[k],
                                       ") is outside the im2col kernel of shape (",
                                       rows_total, ", ", g.filters, ")");
      }
      const int64_t tap = r[k] / g.channels, channel = r[k] % g.channels;
      const int64_t i = tap / kw, j = tap % kw;
      (*nz)[k].x_offset = (channel * g.height + i * pairs_[2][0]) * g.width + j * pairs_[2][1];
      (*nz)[k].filter = c[k];
      (*nz)[k].value = pass_ == Pass::kBackpropValues ? T(0) : values.flat<T>()(k);
    }
    return absl::OkStatus();
  }

  Pass pass_;
  Isa isa_;
  int64 filters_;
  std::vector<std::vector<int32>> pairs_;
};

template <typename T, Pass P>
class SparseConvPassOp : public SparseConvOp<T> {
 public:
  explicit SparseConvPassOp(OpKernelConstruction* ctx) : SparseConvOp<T>(ctx, P) {}
};

#define TFSPARSE_REGISTER_CONV(NAME, PASS)                                               \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_CPU).TypeConstraint<float>("T"),      \
                          SparseConvPassOp<float, PASS>);                                 \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(DEVICE_CPU).TypeConstraint<double>("T"),     \
                          SparseConvPassOp<double, PASS>)

TFSPARSE_REGISTER_CONV("TfsparseSparseConvForward", Pass::kForward);
TFSPARSE_REGISTER_CONV("TfsparseSparseConvBackpropInput", Pass::kBackpropInput);
TFSPARSE_REGISTER_CONV("TfsparseSparseConvBackpropValues", Pass::kBackpropValues);

}  // namespace
