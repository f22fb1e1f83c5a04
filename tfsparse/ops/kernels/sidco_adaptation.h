// SIDCo's adaptive stage count, for the fused op TfsparseSidcoAdaptive
// (sidco.cc): a copy of SIDCo._observe and next_stage_count in
// tfsparse/compression/sidco.py, in the same float32 / int32 arithmetic, so
// both paths move the stage count identically.
//
// The state is that of SIDCo's two variables: the stage count (int32) and
// the adaptation vector (float64, every entry an int32 or a float32 value,
// so exact): [window_calls, window_quality, windows, qualities[0..max],
// recorded[0..max]] (sidco.py, ADAPTATION_LAYOUT).
#ifndef TFSPARSE_OPS_KERNELS_SIDCO_ADAPTATION_H_
#define TFSPARSE_OPS_KERNELS_SIDCO_ADAPTATION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tfsparse_sidco {

struct AdaptationRule {
  int32_t max_stages;
  int32_t adapt_every;
  float band_low, band_high;  // float32, as thresholds compared in float32
  int32_t memory;
};

// Entries of the adaptation vector.
constexpr int kWindowCalls = 0;
constexpr int kWindowQuality = 1;
constexpr int kWindows = 2;
constexpr int kQualities = 3;  // then max_stages + 1 qualities, then recorded

inline int64_t AdaptationSize(int32_t max_stages) {
  return kQualities + 2 * (static_cast<int64_t>(max_stages) + 1);
}

// next_stage_count: qualities / recorded (max_stages + 1 entries each) are
// updated in place; returns the new count. `stages` must lie in
// [0, max_stages] (tf.tensor_scatter_nd_update would fail otherwise).
inline int32_t NextStageCount(int32_t stages, float mean_quality,
                              float* qualities, int32_t* recorded,
                              int32_t window, const AdaptationRule& rule) {
  qualities[stages] = mean_quality;
  recorded[stages] = window;
  const bool in_band =
      mean_quality >= rule.band_low && mean_quality <= rule.band_high;
  const bool too_many = mean_quality > rule.band_high;
  const int32_t preferred = too_many ? stages - 1 : stages + 1;
  const int32_t alternative = too_many ? stages + 1 : stages - 1;
  const float distance = std::fabs(std::log(mean_quality));
  auto usable = [&](int32_t count) {
    const bool inside = count >= 1 && count <= rule.max_stages;
    const int32_t slot = std::min(std::max(count, 0), rule.max_stages);
    const int32_t seen_at = recorded[slot];
    const bool remembered = seen_at >= 0 && window - seen_at < rule.memory;
    const float seen = std::max(qualities[slot], 1e-30f);
    const bool worse = remembered && std::fabs(std::log(seen)) >= distance;
    return inside && !worse;
  };
  if (in_band) return stages;
  if (usable(preferred)) return preferred;
  if (usable(alternative)) return alternative;
  return stages;
}

// SIDCo._observe after a call that sent `achieved` of `target` elements:
// updates `state` (the adaptation vector) and `*stages` in place. Returns
// false, changing nothing, when the window ends with `*stages` outside
// [0, max_stages].
inline bool Observe(int64_t achieved, int64_t target, const AdaptationRule& rule,
                    int32_t* stages, double* state) {
  const bool valid = achieved > 0;
  const float quality = static_cast<float>(achieved) /
                        static_cast<float>(std::max<int64_t>(target, 1));
  const int32_t calls =
      static_cast<int32_t>(state[kWindowCalls]) + (valid ? 1 : 0);
  const float total = static_cast<float>(state[kWindowQuality]) +
                      (valid ? quality : 0.0f);
  if (calls < rule.adapt_every) {
    state[kWindowCalls] = calls;
    state[kWindowQuality] = total;
    return true;
  }
  if (*stages < 0 || *stages > rule.max_stages) return false;
  const int64_t slots = static_cast<int64_t>(rule.max_stages) + 1;
  std::vector<float> qualities(slots);
  std::vector<int32_t> recorded(slots);
  for (int64_t i = 0; i < slots; ++i) {
    qualities[i] = static_cast<float>(state[kQualities + i]);
    recorded[i] = static_cast<int32_t>(state[kQualities + slots + i]);
  }
  const int32_t window = static_cast<int32_t>(state[kWindows]);
  *stages = NextStageCount(*stages, total / static_cast<float>(calls),
                           qualities.data(), recorded.data(), window, rule);
  for (int64_t i = 0; i < slots; ++i) {
    state[kQualities + i] = qualities[i];
    state[kQualities + slots + i] = recorded[i];
  }
  state[kWindows] = window + 1;
  state[kWindowCalls] = 0;
  state[kWindowQuality] = 0;
  return true;
}

}  // namespace tfsparse_sidco

#endif  // TFSPARSE_OPS_KERNELS_SIDCO_ADAPTATION_H_
