// The sparse convolution's three ops (sparse_conv.cc) inside functions XLA
// compiles for the CPU (jit_compile=True): each op becomes an XLA custom call
// to the same direct sparse convolution (sparse_conv.h), run on XLA's
// intra-op thread pool, so a jit-compiled SparseConv2D also computes on the
// kernel's nonzeros only, with no dense kernel.
//
// Each op has an XLA kernel (XlaOpKernel) that emits the custom call with
// the op's attributes, and the call's target is an XLA FFI handler
// registered for the host platform. XLA's GPU compiler gets no kernel: a
// jit-compiled SparseConv2D runs on the CPU only (tfsparse/ops/conv.py says
// so when asked for anything else).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"
#include "blocks.h"
#include "sparse_conv.h"

namespace tfsparse {
namespace conv {

// The op's attributes, as the custom call carries them (an MLIR dictionary:
// SparseConvXlaOp's attributes_).
struct ConvAttributes {
  std::string_view isa;
  int64_t filters;
  std::string_view padding;
  int64_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w;
};

}  // namespace conv
}  // namespace tfsparse

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    ::tfsparse::conv::ConvAttributes, StructMember<std::string_view>("isa"),
    StructMember<int64_t>("filters"), StructMember<std::string_view>("padding"),
    StructMember<int64_t>("kernel_h"), StructMember<int64_t>("kernel_w"),
    StructMember<int64_t>("stride_h"), StructMember<int64_t>("stride_w"),
    StructMember<int64_t>("dilation_h"), StructMember<int64_t>("dilation_w"));

namespace tfsparse {
namespace conv {
namespace {

namespace ffi = ::xla::ffi;

// The custom calls' targets, one per op.
constexpr char kForwardTarget[] = "tfsparse_sparse_conv_forward";
constexpr char kBackpropInputTarget[] = "tfsparse_sparse_conv_backprop_input";
constexpr char kBackpropValuesTarget[] = "tfsparse_sparse_conv_backprop_values";

ConvWorkers WorkersOf(ffi::ThreadPool& pool) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // The caller takes blocks too (Blocks), so the call finishes even when no
  // task of the pool gets to run (the custom call may itself run on one of
  // its threads); it schedules every task, as the pool object is the call's.
  return ConvWorkers{threads, [&pool, threads](int64_t units, int64_t block,
                                               const std::function<void(int64_t, int64_t)>& fn) {
                       Blocks::RunRanges(pool, threads, units, block, Scheduling::kFromCaller, fn);
                     }};
}

template <typename T>
ArrayView<T> ViewOf(const ffi::AnyBuffer& buffer) {
  const auto dims = buffer.dimensions();
  return ArrayView<T>{buffer.typed_data<T>(), std::vector<int64_t>(dims.begin(), dims.end())};
}

// Output `index` of `results`, checked to have the shape RunConv asks for.
template <typename T>
ConvOutputs<T> OutputsOf(std::vector<ffi::Result<ffi::AnyBuffer>*> results) {
  return [results](int index, const std::vector<int64_t>& shape) -> absl::StatusOr<T*> {
    ffi::AnyBuffer& out = **results[index];
    const auto dims = out.dimensions();
    if (std::vector<int64_t>(dims.begin(), dims.end()) != shape) {
      return absl::InternalError(absl::StrCat("output ", index, " of the custom call is [",
                                              absl::StrJoin(dims, ", "), "], the pass makes [",
                                              absl::StrJoin(shape, ", "), "]"));
    }
    return out.typed_data<T>();
  };
}

ffi::Error ErrorOf(const absl::Status& status) {
  if (status.ok()) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string(status.message()));
}

// Runs run(settings, T{}) for the call's settings and element type T,
// float32 or float64.
template <typename Run>
ffi::Error RunPass(ffi::DataType type, const ConvAttributes& a, const Run& run) {
  ConvSettings settings;
  const absl::Status made = MakeConvSettings(
      std::string(a.isa), a.filters, std::string(a.padding),
      {{a.kernel_h, a.kernel_w}, {a.stride_h, a.stride_w}, {a.dilation_h, a.dilation_w}},
      &settings);
  if (!made.ok()) return ErrorOf(made);
  if (type == ffi::DataType::F32) return ErrorOf(run(settings, float{}));
  if (type == ffi::DataType::F64) return ErrorOf(run(settings, double{}));
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    "tfsparse's sparse convolution takes float32 or float64");
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer values,
                   ffi::AnyBuffer rows, ffi::AnyBuffer cols, ffi::AnyBuffer bias,
                   ffi::Result<ffi::AnyBuffer> y, ConvAttributes attributes) {
  return RunPass(x.element_type(), attributes, [&](const ConvSettings& settings, auto zero) {
    using T = decltype(zero);
    ConvInputs<T> in;
    in.x = ViewOf<T>(x);
    in.values = ViewOf<T>(values);
    in.bias = ViewOf<T>(bias);
    in.rows = ViewOf<int32_t>(rows);
    in.cols = ViewOf<int32_t>(cols);
    return RunConv<T>(settings, Pass::kForward, in, OutputsOf<T>({&y}), WorkersOf(pool));
  });
}

ffi::Error BackpropInput(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer values,
                         ffi::AnyBuffer rows, ffi::AnyBuffer cols,
                         ffi::Result<ffi::AnyBuffer> dx, ConvAttributes attributes) {
  return RunPass(dy.element_type(), attributes, [&](const ConvSettings& settings, auto zero) {
    using T = decltype(zero);
    ConvInputs<T> in;
    in.dy = ViewOf<T>(dy);
    in.values = ViewOf<T>(values);
    in.rows = ViewOf<int32_t>(rows);
    in.cols = ViewOf<int32_t>(cols);
    in.input_shape = ViewOf<T>(*dx).shape;  // dx has x's shape
    return RunConv<T>(settings, Pass::kBackpropInput, in, OutputsOf<T>({&dx}),
                      WorkersOf(pool));
  });
}

ffi::Error BackpropValues(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                          ffi::AnyBuffer rows, ffi::AnyBuffer cols,
                          ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dbias,
                          ConvAttributes attributes) {
  return RunPass(x.element_type(), attributes, [&](const ConvSettings& settings, auto zero) {
    using T = decltype(zero);
    ConvInputs<T> in;
    in.x = ViewOf<T>(x);
    in.dy = ViewOf<T>(dy);
    in.rows = ViewOf<int32_t>(rows);
    in.cols = ViewOf<int32_t>(cols);
    return RunConv<T>(settings, Pass::kBackpropValues, in, OutputsOf<T>({&dv, &dbias}),
                      WorkersOf(pool));
  });
}

XLA_FFI_DEFINE_HANDLER(kForwardHandler, Forward,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()  // x
                           .Arg<ffi::AnyBuffer>()  // values
                           .Arg<ffi::AnyBuffer>()  // rows
                           .Arg<ffi::AnyBuffer>()  // cols
                           .Arg<ffi::AnyBuffer>()  // bias
                           .Ret<ffi::AnyBuffer>()  // y
                           .Attrs<ConvAttributes>());
XLA_FFI_DEFINE_HANDLER(kBackpropInputHandler, BackpropInput,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()  // dy
                           .Arg<ffi::AnyBuffer>()  // values
                           .Arg<ffi::AnyBuffer>()  // rows
                           .Arg<ffi::AnyBuffer>()  // cols
                           .Ret<ffi::AnyBuffer>()  // dx
                           .Attrs<ConvAttributes>());
XLA_FFI_DEFINE_HANDLER(kBackpropValuesHandler, BackpropValues,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()  // x
                           .Arg<ffi::AnyBuffer>()  // dy
                           .Arg<ffi::AnyBuffer>()  // rows
                           .Arg<ffi::AnyBuffer>()  // cols
                           .Ret<ffi::AnyBuffer>()  // dv
                           .Ret<ffi::AnyBuffer>()  // dbias
                           .Attrs<ConvAttributes>());

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kForwardTarget, "Host", kForwardHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kBackpropInputTarget, "Host", kBackpropInputHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kBackpropValuesTarget, "Host",
                         kBackpropValuesHandler);

}  // namespace
}  // namespace conv
}  // namespace tfsparse

namespace tensorflow {
namespace {

using tfsparse::conv::ConvSettings;
using tfsparse::conv::Pass;

// One op inside an XLA computation: a custom call to its handler, with the
// op's attributes as the call's (MLIR dictionary) attributes and its output
// shapes from the inputs' static shapes.
class SparseConvXlaOp : public XlaOpKernel {
 public:
  SparseConvXlaOp(OpKernelConstruction* ctx, Pass pass) : XlaOpKernel(ctx), pass_(pass) {
    OP_REQUIRES_OK(ctx, tfsparse::conv::ConvSettingsFromAttrs(ctx, &settings_));
    std::string isa;  // as given: "" stays the widest variant the CPU runs
    OP_REQUIRES_OK(ctx, ctx->GetAttr("isa", &isa));
    const auto& p = settings_.pairs;
    attributes_ = absl::StrCat(
        "{isa = \"", isa, "\", filters = ", settings_.filters, " : i64, padding = \"",
        settings_.same ? "SAME" : "VALID", "\", kernel_h = ", p[0][0], " : i64, kernel_w = ",
        p[0][1], " : i64, stride_h = ", p[1][0], " : i64, stride_w = ", p[1][1],
        " : i64, dilation_h = ", p[2][0], " : i64, dilation_w = ", p[2][1], " : i64}");
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const xla::PrimitiveType type = ctx->input_xla_type(0);
    std::vector<xla::XlaOp> operands{ctx->Input(0), ctx->Input(1), ctx->Input(2),
                                     ctx->Input(3)};
    std::vector<int64_t> shape;
    const char* target;
    if (pass_ == Pass::kForward) {
      operands.push_back(ctx->Input(4));
      const TensorShape x = ctx->InputShape(0);
      OP_REQUIRES(ctx, x.dims() == 4, errors::InvalidArgument("x must be 4-D [B, H, W, C]"));
      const auto dims = x.dim_sizes();
      shape = tfsparse::conv::ForwardOutputShape(settings_, {dims.begin(), dims.end()});
      target = tfsparse::conv::kForwardTarget;
    } else if (pass_ == Pass::kBackpropInput) {
      OP_REQUIRES_OK(ctx, ctx->ConstantInputAsIntVector(4, &shape));
      OP_REQUIRES_OK(ctx, tfsparse::conv::CheckInputShape(shape));
      target = tfsparse::conv::kBackpropInputTarget;
    } else {
      const int64_t nnz = ctx->InputShape(2).num_elements();
      const xla::Shape outputs = xla::ShapeUtil::MakeTupleShape(
          {xla::ShapeUtil::MakeShape(type, {nnz}),
           xla::ShapeUtil::MakeShape(type, {settings_.filters})});
      const xla::XlaOp call = Call(ctx, tfsparse::conv::kBackpropValuesTarget, operands, outputs);
      ctx->SetOutput(0, xla::GetTupleElement(call, 0));
      ctx->SetOutput(1, xla::GetTupleElement(call, 1));
      return;
    }
    ctx->SetOutput(0, Call(ctx, target, operands, xla::ShapeUtil::MakeShape(type, shape)));
  }

 private:
  xla::XlaOp Call(XlaOpKernelContext* ctx, const char* target,
                  const std::vector<xla::XlaOp>& operands, const xla::Shape& shape) const {
    return xla::CustomCall(ctx->builder(), target, operands, shape, attributes_,
                           /*has_side_effect=*/false, /*output_operand_aliasing=*/{},
                           /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
                           xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
  }

  Pass pass_;
  ConvSettings settings_;
  std::string attributes_;
};

template <Pass P>
class SparseConvXlaPassOp : public SparseConvXlaOp {
 public:
  explicit SparseConvXlaPassOp(OpKernelConstruction* ctx) : SparseConvXlaOp(ctx, P) {}
};

// XLA registers the JIT devices' kernels of every XLA op once, at its first
// compilation; a library loaded after that would get none. So the
// registration runs now (a no-op if it already has), and the kernels below
// are registered for the CPU's JIT device directly.
const bool jit_kernels_registered = [] {
  XlaOpRegistry::RegisterCompilationKernels();
  return true;
}();

#define TFSPARSE_REGISTER_CONV_XLA(NAME, PASS, XLA_OPTIONS, KERNEL_OPTIONS)                \
  REGISTER_XLA_OP(Name(NAME).Device(DEVICE_CPU_XLA_JIT) XLA_OPTIONS,                        \
                  SparseConvXlaPassOp<PASS>);                                                \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name(NAME).Device(DEVICE_CPU_XLA_JIT).TypeConstraint("T", {DT_FLOAT, DT_DOUBLE})     \
          KERNEL_OPTIONS,                                                                   \
      SparseConvXlaPassOp<PASS>)

TFSPARSE_REGISTER_CONV_XLA("TfsparseSparseConvForward", Pass::kForward, , );
TFSPARSE_REGISTER_CONV_XLA("TfsparseSparseConvBackpropInput", Pass::kBackpropInput,
                           .CompileTimeConstantInput("input_shape"),
                           .HostMemory("input_shape"));
TFSPARSE_REGISTER_CONV_XLA("TfsparseSparseConvBackpropValues", Pass::kBackpropValues, , );

}  // namespace
}  // namespace tensorflow
