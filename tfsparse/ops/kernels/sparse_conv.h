// The direct sparse convolution (sparse_conv.cc) apart from the runtime that
// calls it: TensorFlow's op kernels (sparse_conv.cc) and XLA's custom calls
// (sparse_conv_xla.cc) each hand it their tensors, their output buffers and
// their thread pool.
#ifndef TFSPARSE_OPS_KERNELS_SPARSE_CONV_H_
#define TFSPARSE_OPS_KERNELS_SPARSE_CONV_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "isa.h"

namespace tfsparse {
namespace conv {

enum class Pass { kForward, kBackpropInput, kBackpropValues };

// The ops' attributes (TFSPARSE_CONV_ATTRS in sparse_conv.cc).
struct ConvSettings {
  Isa isa;
  int64_t filters;
  bool same;
  std::vector<std::vector<int64_t>> pairs;  // kernel_size, strides, dilations
};

// Checks the attributes (each pair two positive ints, padding "VALID" or
// "SAME") and gathers them.
absl::Status MakeConvSettings(const std::string& isa, int64_t filters,
                              const std::string& padding,
                              const std::vector<std::vector<int64_t>>& pairs,
                              ConvSettings* settings);

// Reads and checks an op's attributes (MakeConvSettings).
absl::Status ConvSettingsFromAttrs(tensorflow::OpKernelConstruction* ctx,
                                   ConvSettings* settings);

// A read-only tensor: its data and shape.
template <typename T>
struct ArrayView {
  const T* data = nullptr;
  std::vector<int64_t> shape;

  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// One call's inputs; a pass reads those of its op:
//   kForward        x, values, rows, cols, bias (empty for none)
//   kBackpropInput  dy, values, rows, cols, input_shape (x's shape)
//   kBackpropValues x, dy, rows, cols
template <typename T>
struct ConvInputs {
  ArrayView<T> x, dy, values, bias;
  ArrayView<int32_t> rows, cols;
  std::vector<int64_t> input_shape;
};

// Returns the buffer of output `index` (y; dx; dv then dbias), which has
// `shape`.
template <typename T>
using ConvOutputs = std::function<absl::StatusOr<T*>(int index, const std::vector<int64_t>& shape)>;

// A thread pool: parallel_for(units, block, fn) runs fn(begin, end) over
// [0, units) in blocks of about `block` units, returning when all are done.
struct ConvWorkers {
  int64_t threads;
  std::function<void(int64_t, int64_t, const std::function<void(int64_t, int64_t)>&)>
      parallel_for;
};

// OK when `input_shape` (the input gradient's: x's shape) is 4 sizes >= 0
// whose product fits int64, else an error naming it.
absl::Status CheckInputShape(const std::vector<int64_t>& input_shape);

// The forward pass's output shape [B, OH, OW, filters] for x of `x_shape`.
std::vector<int64_t> ForwardOutputShape(const ConvSettings& settings,
                                        const std::vector<int64_t>& x_shape);

// Runs one pass: checks the inputs, then computes its outputs.
template <typename T>
absl::Status RunConv(const ConvSettings& settings, Pass pass, const ConvInputs<T>& inputs,
                     const ConvOutputs<T>& outputs, const ConvWorkers& workers);

}  // namespace conv
}  // namespace tfsparse

#endif  // TFSPARSE_OPS_KERNELS_SPARSE_CONV_H_
