// SIDCo's closed-form threshold estimators in double precision: copies of
// tfsparse/compression/thresholds.py (same formulas, same guards, same
// Halley iteration for the inverse incomplete gamma function), with Eigen's
// igamma / igammac / ndtri, which are what tf.math uses on CPU.
#ifndef TFSPARSE_OPS_KERNELS_SIDCO_ESTIMATORS_H_
#define TFSPARSE_OPS_KERNELS_SIDCO_ESTIMATORS_H_

#include <algorithm>
#include <cmath>
#include <limits>

#include "unsupported/Eigen/SpecialFunctions"

namespace tfsparse_sidco {

// 1 for a `reference` magnitude in 2^-400 .. 2^400, else a power of two
// near 1 / reference (1 for zero, Inf or NaN): the factor the fits take
// squares of magnitudes by, so that the squares and the variance stay in
// double's range (only float64 magnitudes can leave it: a float's square
// is a double's normal number). Multiplying by it is exact.
inline double ScaleFor(double reference) {
  if (!(reference > 0) || !std::isfinite(reference)) return 1.0;
  const int exponent = std::ilogb(reference);
  if (exponent >= -400 && exponent < 400) return 1.0;
  return std::ldexp(1.0, -std::clamp(exponent, -1000, 1000));
}

inline double ExponentialThreshold(double mean, double ratio) {
  return -mean * std::log(ratio);
}

inline double GparetoThreshold(double mean, double variance, double ratio) {
  const double log_ratio = std::log(ratio);
  const bool degenerate = variance <= 1e-12 * mean * mean;
  const double q = mean * mean / (degenerate ? 1.0 : variance);
  const double alpha = 0.5 * mean * (q + 1.0);
  const double k = 0.5 * (q - 1.0);
  if (degenerate) return mean;
  if (std::abs(k) < 1e-8) return -alpha * log_ratio;
  return -alpha * std::expm1(k * log_ratio) / k;
}

// x with P(a, x) = p, given p and q = 1 - p exactly: thresholds._halley_inverse.
inline double HalleyInverse(double a, double p, double q) {
  const bool lower = p <= 0.5;
  const double z =
      Eigen::numext::ndtri(std::min(std::max(p, 1e-300), 1.0 - 1e-16));
  const double wilson_hilferty =
      a * std::pow(std::max(1.0 - 1.0 / (9.0 * a) + z / (3.0 * std::sqrt(a)),
                            0.0),
                   3.0);
  const double series = std::exp((std::log(p) + std::lgamma(a + 1.0)) / a);
  const double t = 1.0 - a * (0.253 + a * 0.12);
  const double tail = 1.0 - std::log(std::max(q, 1e-300) / (1.0 - t));
  const double small_a = p < t ? std::exp(std::log(p / t) / a) : tail;
  double x = a > 1.0 ? std::max(wilson_hilferty, series) : small_a;
  x = std::max(x, 1e-300);
  const double log_gamma_a = std::lgamma(a);
  for (int step = 0; step < 20; ++step) {
    const double err = lower ? Eigen::numext::igamma(a, x) - p
                             : q - Eigen::numext::igammac(a, x);
    const double density = std::exp((a - 1.0) * std::log(x) - x - log_gamma_a);
    const double u = err / std::max(density, 1e-300);
    const double halley =
        u / (1.0 - 0.5 * std::min(u * ((a - 1.0) / x - 1.0), 1.0));
    const double next = x - halley;
    x = next > 0.0 ? next : 0.5 * x;
  }
  if (q <= 0.0) return std::numeric_limits<double>::infinity();
  if (p <= 0.0) return 0.0;
  return x;
}

inline double GammaThreshold(double mean, double log_gap, double ratio) {
  if (log_gap <= 1e-12) return mean;
  const double s = std::max(log_gap, 1e-12);
  const double shape =
      (3.0 - s + std::sqrt((s - 3.0) * (s - 3.0) + 24.0 * s)) / (12.0 * s);
  return mean / shape * HalleyInverse(shape, 1.0 - ratio, ratio);
}

}  // namespace tfsparse_sidco

#endif  // TFSPARSE_OPS_KERNELS_SIDCO_ESTIMATORS_H_
