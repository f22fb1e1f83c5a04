// The memory passes of the fused SIDCo op (sidco.cc): sums of |x| (and of
// x^2, ln|x|, the nonzero count) and the selection of the elements above a
// threshold. Portable code that GCC/Clang vectorize (-O3 -march=native
// -fopenmp-simd, as tfsparse/ops/build.py compiles), plus AVX-512 versions
// of the two loops compilers do not vectorize well (the logarithm and the
// compaction), used when the library is built for an AVX-512 CPU.
#ifndef TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_
#define TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

#if defined(__AVX512F__)
// FastLog on 16 lanes: getexp/getmant split x (subnormals included).
inline __m512 FastLog16(__m512 x) {
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
  __m512 e = _mm512_getexp_ps(x);
  const __mmask16 high =
      _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356237309505f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, high, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, high, e, _mm512_set1_ps(1.0f));
  m = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(m, m);
  __m512 y = _mm512_set1_ps(7.0376836292e-2f);
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.1514610310e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.1676998740e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.2420140846e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(1.4249322787e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-1.6668057665e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(2.0000714765e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(-2.4999993993e-1f));
  y = _mm512_fmadd_ps(y, m, _mm512_set1_ps(3.3333331174e-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, m), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), y);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(m, y));
}
#endif

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

// Sums of |x| over [begin, end), with kSquares the sum of x^2, with kCount
// the number of nonzeros, with kLog the sum of ln(|x| + log_offset) over the
// elements where |x| + log_offset > 0 (their number in `positive`, the
// least and largest such argument in `low` and `high`).
template <typename T, bool kSquares, bool kCount, bool kLog>
Sums BlockSums(const T* x, int64_t begin, int64_t end, T log_offset) {
  Sums out;
  T low = std::numeric_limits<T>::infinity();
  T high = -std::numeric_limits<T>::infinity();
  for (int64_t b = begin; b < end; b += kSumBlock) {
    const int64_t e = std::min(end, b + kSumBlock);
    T s = 0, q = 0, c = 0, p = 0;
    double l = 0;
#pragma omp simd reduction(+ : s, q, l, c, p) reduction(min : low) \
    reduction(max : high)
    for (int64_t i = b; i < e; ++i) {
      const T a = std::fabs(x[i]);
      s += a;
      if (kSquares) q += a * a;
      if (kCount) c += a != T(0) ? T(1) : T(0);
      if (kLog) {
        const T shifted = a + log_offset;
        const T log = FastLog(shifted);  // meaningless where unused
        const bool use = shifted > T(0);
        l += use ? static_cast<double>(log) : 0.0;
        p += use ? T(1) : T(0);
        low = use ? std::min(low, shifted) : low;
        high = use ? std::max(high, shifted) : high;
      }
    }
    out.sum += s;
    out.squares += q;
    out.logs += l;
    out.nonzero += static_cast<int64_t>(c);
    out.positive += static_cast<int64_t>(p);
  }
  out.low = low;
  out.high = high;
  return out;
}

#if defined(__AVX512F__)
// The float log sums on 16 lanes, as the log of a product: with
// y = 2^e * m, m in [1, 2) (getexp / getmant, both exact), the sum of ln y is
// ln 2 * sum e + ln(prod m). Per element that is two exact operations and a
// multiplication instead of a 20-operation polynomial. The exponents add
// exactly (in float within a block: at most 2048 * 149 < 2^24; then in
// double); each multiplication rounds by at most 2^-24 relative, so the mean
// of ln y is off by at most 6e-8 and in practice (independent roundings) by
// ~1e-11, against ~4e-8 per element for FastLog. Four products of 32
// mantissas (< 2^32) per block are renormalized into a running product in
// [1, 2), whose log is taken once per lane at the end.
// y = |x| + log_offset with kOffset, else |x|; as BlockSums, elements count
// where y > 0 (NaN never does; their number in `positive`, their least and
// largest y in `low` and `high`); kCount counts the nonzeros.
template <bool kCount, bool kOffset>
Sums LogSums16(const float* x, int64_t begin, int64_t end, float log_offset) {
  Sums out;
  const __m512 offset = _mm512_set1_ps(log_offset);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 running = one;  // product of all mantissas so far, renormalized
  __m512d exps_low = _mm512_setzero_pd(), exps_high = _mm512_setzero_pd();
  __m512 low = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 high = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t b = begin;
  for (; b + kSumBlock <= end; b += kSumBlock) {
    __m512 s[4], c[4], p[4], e[4], m[4];
    for (int k = 0; k < 4; ++k) s[k] = c[k] = p[k] = e[k] = zero, m[k] = one;
    for (int64_t g = b; g < b + kSumBlock; g += 64) {
      for (int k = 0; k < 4; ++k) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + g + 16 * k));
        s[k] = _mm512_add_ps(s[k], a);
        if (kCount) {
          c[k] = _mm512_mask_add_ps(
              c[k], _mm512_cmp_ps_mask(a, zero, _CMP_NEQ_UQ), c[k], one);
        }
        const __m512 y = kOffset ? _mm512_add_ps(a, offset) : a;
        const __mmask16 use = _mm512_cmp_ps_mask(y, zero, _CMP_GT_OQ);
        m[k] = _mm512_mask_mul_ps(
            m[k], use, m[k],
            _mm512_getmant_ps(y, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero));
        e[k] = _mm512_mask_add_ps(e[k], use, e[k], _mm512_getexp_ps(y));
        p[k] = _mm512_mask_add_ps(p[k], use, p[k], one);
        low = _mm512_mask_min_ps(low, use, low, y);
        high = _mm512_mask_max_ps(high, use, high, y);
      }
    }
    __m512 exps = _mm512_add_ps(_mm512_add_ps(e[0], e[1]),
                                _mm512_add_ps(e[2], e[3]));
    for (int k = 0; k < 4; ++k) {
      exps = _mm512_add_ps(exps, _mm512_getexp_ps(m[k]));
      running = _mm512_mul_ps(
          running,
          _mm512_getmant_ps(m[k], _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero));
    }
    exps = _mm512_add_ps(exps, _mm512_getexp_ps(running));  // running < 32
    running = _mm512_getmant_ps(running, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
    exps_low = _mm512_add_pd(exps_low,
                             _mm512_cvtps_pd(_mm512_castps512_ps256(exps)));
    exps_high = _mm512_add_pd(
        exps_high, _mm512_cvtps_pd(_mm256_castpd_ps(
                       _mm512_extractf64x4_pd(_mm512_castps_pd(exps), 1))));
    out.sum += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]),
                                                  _mm512_add_ps(s[2], s[3])));
    if (kCount) {
      out.nonzero += static_cast<int64_t>(_mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(c[0], c[1]), _mm512_add_ps(c[2], c[3]))));
    }
    out.positive += static_cast<int64_t>(_mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]))));
  }
  alignas(64) float mantissas[16];
  _mm512_store_ps(mantissas, running);
  double logs = (_mm512_reduce_add_pd(exps_low) +
                 _mm512_reduce_add_pd(exps_high)) *
                0.693147180559945309417232121458;
  for (int k = 0; k < 16; ++k) logs += std::log(static_cast<double>(mantissas[k]));
  out.logs = logs;
  out.low = _mm512_reduce_min_ps(low);
  out.high = _mm512_reduce_max_ps(high);
  // The tail (under one block).
  out.Add(BlockSums<float, false, kCount, true>(x, b, end, log_offset));
  return out;
}
#endif

template <typename T>
Sums RangeSums(const T* x, int64_t begin, int64_t end, bool squares,
               bool count, bool logs, T log_offset) {
  if (logs) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      if (log_offset != 0) {
        return count ? LogSums16<true, true>(x, begin, end, log_offset)
                     : LogSums16<false, true>(x, begin, end, log_offset);
      }
      return count ? LogSums16<true, false>(x, begin, end, log_offset)
                   : LogSums16<false, false>(x, begin, end, log_offset);
    }
#endif
    return BlockSums<T, false, true, true>(x, begin, end, log_offset);
  }
  if (squares) return BlockSums<T, true, true, false>(x, begin, end, T(0));
  if (count) return BlockSums<T, false, true, false>(x, begin, end, T(0));
  return BlockSums<T, false, false, false>(x, begin, end, T(0));
}

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

// Appends the elements of x[begin, end) with |x| > threshold (NaN never is):
// a vectorized test skips blocks of 16 without survivors, the others are
// copied branch-free (every element written, the cursor advanced by the test).
template <typename T>
void SelectRangePortable(const T* x, int64_t begin, int64_t end, T threshold,
                         int64_t c, Segment<T>* out) {
  constexpr int64_t kBlock = 16;
  out->Reserve(c + kBlock);
  int64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t j = 0; j < kBlock; ++j) {
      any |= std::fabs(x[i + j]) > threshold ? 1 : 0;
    }
    if (!any) continue;
    if (c + kBlock > out->Capacity()) out->Reserve(c + kBlock);
    T* values = out->values.data();
    int32_t* indices = out->indices.data();
    for (int64_t j = 0; j < kBlock; ++j) {
      const T v = x[i + j];
      values[c] = v;
      indices[c] = static_cast<int32_t>(i + j);
      c += std::fabs(v) > threshold ? 1 : 0;
    }
  }
  out->Reserve(c + kBlock);
  for (; i < end; ++i) {
    const T v = x[i];
    out->values[c] = v;
    out->indices[c] = static_cast<int32_t>(i);
    c += std::fabs(v) > threshold ? 1 : 0;
  }
  out->count = c;
}

#if defined(__AVX512F__)
// Compaction on 16 lanes (compress into a register, then an unaligned
// store: the memory-destination compress is slow on some CPUs); four
// vectors are tested at once, so sparse selections branch once per 64.
inline void SelectRange16(const float* x, int64_t begin, int64_t end,
                          float threshold, Segment<float>* out) {
  const __m512 t = _mm512_set1_ps(threshold);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5,
                                        4, 3, 2, 1, 0);
  int64_t c = 0;
  out->Reserve(64);
  int64_t i = begin;
  for (; i + 64 <= end; i += 64) {
    __m512 v[4];
    __mmask16 m[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm512_loadu_ps(x + i + 16 * k);
      m[k] = _mm512_cmp_ps_mask(_mm512_abs_ps(v[k]), t, _CMP_GT_OQ);
    }
    if ((m[0] | m[1] | m[2] | m[3]) == 0) continue;
    if (c + 64 > out->Capacity()) out->Reserve(c + 64);
    float* values = out->values.data();
    int32_t* indices = out->indices.data();
    for (int k = 0; k < 4; ++k) {
      const __m512i position = _mm512_add_epi32(
          lane, _mm512_set1_epi32(static_cast<int32_t>(i + 16 * k)));
      _mm512_storeu_ps(values + c, _mm512_maskz_compress_ps(m[k], v[k]));
      _mm512_storeu_si512(indices + c,
                          _mm512_maskz_compress_epi32(m[k], position));
      c += _mm_popcnt_u32(m[k]);
    }
  }
  SelectRangePortable<float>(x, i, end, threshold, c, out);
}

// Compaction by bit scans, for sparse survivors: the 64 comparison bits of
// 64 elements, then kUnconditional survivors copied without a branch (the
// lowest set bit, or a harmless copy not counted when there is none), then
// a loop for the rarely remaining others. Around 1% survivors the group
// test of SelectRange16 is taken half of the time, unpredictably, unless
// the branch predictor has learnt the very same tensor. Measured on 1M
// Laplace elements, with gradients that change from call to call (as in
// training): the whole op at 1% took 117-139 us (kUnconditional = 1)
// against 213-226 us; on one tensor repeated, 112 against 106-113 us. The
// pass alone: 52 vs 92 us at 0.5%, 68 vs 141 us at 1%, 85 (kUnconditional
// = 2) vs 135 us at 2%.
template <int kUnconditional>
void SelectBits16(const float* x, int64_t begin, int64_t end, float threshold,
                  Segment<float>* out) {
  const __m512 t = _mm512_set1_ps(threshold);
  int64_t c = 0;
  out->Reserve(64);
  int64_t i = begin;
  for (; i + 64 <= end; i += 64) {
    uint64_t mask = 0;
    for (int k = 0; k < 4; ++k) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i + 16 * k));
      mask |= static_cast<uint64_t>(_mm512_cmp_ps_mask(a, t, _CMP_GT_OQ))
              << (16 * k);
    }
    if (c + 64 > out->Capacity()) out->Reserve(c + 64);
    float* values = out->values.data();
    int32_t* indices = out->indices.data();
    for (int u = 0; u < kUnconditional; ++u) {
      const int j = __builtin_ctzll(mask | (uint64_t{1} << 63));
      values[c] = x[i + j];
      indices[c] = static_cast<int32_t>(i + j);
      c += mask != 0 ? 1 : 0;
      mask &= mask - 1;
    }
    while (mask != 0) {
      const int j = __builtin_ctzll(mask);
      values[c] = x[i + j];
      indices[c] = static_cast<int32_t>(i + j);
      ++c;
      mask &= mask - 1;
    }
  }
  SelectRangePortable<float>(x, i, end, threshold, c, out);
}
#endif

// Appends the elements of x[begin, end) with |x| > threshold to `out`
// (replacing its contents). `fraction`, the expected fraction of survivors,
// only picks the fastest compaction (measured on 1M elements, see
// SelectBits16): the 16-lane compaction below 0.2% and from 3%, bit scans
// between.
template <typename T>
void SelectRange(const T* x, int64_t begin, int64_t end, T threshold,
                 Segment<T>* out, double fraction = 1.0) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (fraction >= 0.002 && fraction < 0.015) {
      return SelectBits16<1>(x, begin, end, threshold, out);
    }
    if (fraction >= 0.015 && fraction < 0.03) {
      return SelectBits16<2>(x, begin, end, threshold, out);
    }
    return SelectRange16(x, begin, end, threshold, out);
  }
#endif
  SelectRangePortable<T>(x, begin, end, threshold, 0, out);
}

// Keeps, in place, the elements of a segment with |value| > threshold.
template <typename T>
void FilterSegment(T threshold, Segment<T>* segment) {
  T* values = segment->values.data();
  int32_t* indices = segment->indices.data();
  int64_t c = 0;
  int64_t k = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    // In place is safe: the write position c never passes the read position k.
    const __m512 t = _mm512_set1_ps(threshold);
    for (; k + 16 <= segment->count; k += 16) {
      const __m512 v = _mm512_loadu_ps(values + k);
      const __m512i position = _mm512_loadu_si512(indices + k);
      const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(v), t, _CMP_GT_OQ);
      _mm512_storeu_ps(values + c, _mm512_maskz_compress_ps(m, v));
      _mm512_storeu_si512(indices + c, _mm512_maskz_compress_epi32(m, position));
      c += _mm_popcnt_u32(m);
    }
  }
#endif
  for (; k < segment->count; ++k) {
    const T v = values[k];
    const int32_t position = indices[k];
    values[c] = v;
    indices[c] = position;
    c += std::fabs(v) > threshold ? 1 : 0;
  }
  segment->count = c;
}

// Count, minimum, and sums of the excess over `threshold` (and of its
// square) of the magnitudes in a segment: thresholds._survivor_sums.
struct Excess {
  int64_t count = 0;
  double low = std::numeric_limits<double>::infinity();
  double sum = 0, squares = 0;
};

template <typename T>
void AddExcess(const Segment<T>& segment, T threshold, Excess* out) {
  const T* values = segment.values.data();
  for (int64_t b = 0; b < segment.count; b += kSumBlock) {
    const int64_t e = std::min(segment.count, b + kSumBlock);
    T s = 0, q = 0, low = std::numeric_limits<T>::infinity();
#pragma omp simd reduction(+ : s, q) reduction(min : low)
    for (int64_t k = b; k < e; ++k) {
      const T a = std::fabs(values[k]);
      const T excess = a - threshold;
      s += excess;
      q += excess * excess;
      low = std::min(low, a);
    }
    out->sum += s;
    out->squares += q;
    out->low = std::min(out->low, static_cast<double>(low));
  }
  out->count += segment.count;
}

}  // namespace tfsparse_sidco

#endif  // TFSPARSE_OPS_KERNELS_SIDCO_PASSES_H_
