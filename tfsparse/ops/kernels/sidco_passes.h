// The data of the fused SIDCo op's memory passes (sidco.cc): the sums of a
// pass, the survivor segments, the scalar logarithm, and the table of pass
// functions one instruction-set variant provides (sidco_passes_variant.inc,
// compiled once per variant by variants.inc).
#ifndef TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_
#define TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace tfsparse_sidco {

// ---------------------------------------------------------------- fast log
// ln(x) for x > 0 (normal or subnormal), branch-free so loops vectorize:
// x = 2^e * m with m in [sqrt(1/2), sqrt(2)), ln(m) by Cephes' logf
// polynomial (the one Eigen, hence tf.math.log, uses). Measured against a
// float64 log over 10^7 random floats of all exponents: relative error at
// most 8e-8 (|ln x| > 1e-3) and absolute error at most 4e-8 on [0.5, 2)
// (1 ulp of float32), as accurate as logf; the gamma fit needs only the
// mean of ln|g|.
inline float FastLog(float x) {
  const bool subnormal = x < std::numeric_limits<float>::min();
  x = subnormal ? x * 8388608.0f : x;  // 2^23
  int32_t bits = __builtin_bit_cast(int32_t, x);
  const int32_t exponent = ((bits >> 23) & 0xff) - (subnormal ? 149 : 126);
  bits = (bits & 0x807fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  float m = __builtin_bit_cast(float, bits);
  float e = static_cast<float>(exponent);
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  return m + y + 0.693359375f * e;
}

inline double FastLog(double x) { return std::log(x); }

// ------------------------------------------------------ whole-tensor sums
struct Sums {
  double sum = 0, squares = 0, logs = 0;
  int64_t nonzero = 0, positive = 0;
  // The least and largest log argument, to recognize constant magnitudes.
  double low = std::numeric_limits<double>::infinity();
  double high = -std::numeric_limits<double>::infinity();
  void Add(const Sums& o) {
    sum += o.sum;
    squares += o.squares;
    logs += o.logs;
    nonzero += o.nonzero;
    positive += o.positive;
    low = std::min(low, o.low);
    high = std::max(high, o.high);
  }
};

// Blocks summed in the input type (vector lanes), then added in double.
constexpr int64_t kSumBlock = 2048;

// ------------------------------------------------------ survivor segments
// Elements above a threshold (values and int32 positions, ascending). The
// vectors only grow; `count` is the number in use. Every store may write up
// to kSlack elements past `count`.
constexpr int64_t kSlack = 64;

template <typename T>
struct Segment {
  std::vector<T> values;
  std::vector<int32_t> indices;
  int64_t count = 0;
  void Reserve(int64_t n) {
    n += kSlack;
    if (static_cast<int64_t>(values.size()) < n) {
      const int64_t grown = std::max<int64_t>(n, 2 * values.size());
      values.resize(grown);
      indices.resize(grown);
    }
  }
  int64_t Capacity() const {
    return static_cast<int64_t>(values.size()) - kSlack;
  }
};

// Count, minimum, and sums of the excess over `threshold` times `scale`
// (and of its square) of the magnitudes in a segment:
// thresholds._survivor_sums.
struct Excess {
  int64_t count = 0;
  double low = std::numeric_limits<double>::infinity();
  double sum = 0, squares = 0;
};

// The passes of one instruction-set variant (sidco_passes_variant.inc).
template <typename T>
struct Passes {
  // Sums of |x| over [begin, end): see BlockSums.
  Sums (*range_sums)(const T* x, int64_t begin, int64_t end, bool squares,
                     bool count, bool logs, T log_offset);
  // The elements above `threshold` into `out`: see SelectRange.
  void (*select_range)(const T* x, int64_t begin, int64_t end, T threshold,
                       Segment<T>* out, double fraction);
  void (*filter_segment)(T threshold, Segment<T>* segment);
  void (*add_excess)(const Segment<T>& segment, T threshold, T scale,
                     Excess* out);
  // The sum of (|x| * scale)^2 over [begin, end), in double.
  double (*scaled_squares)(const T* x, int64_t begin, int64_t end, T scale);
};

}  // namespace tfsparse_sidco

#endif  // TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_
