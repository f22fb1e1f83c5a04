// TfsparseSidco: SIDCo's threshold estimation and selection, fused.
//
// The pure-TensorFlow path (tfsparse/compression/thresholds.py and
// select_above in tfsparse/compression/base.py) runs a dozen whole-tensor
// passes (abs, sums, masks, tf.where, gather) plus per-op overhead. This op
// computes the same estimate in as few passes as possible:
//
//   1. one pass accumulates sum |g|, and as the fit needs: sum g^2, the
//      nonzero count, sum ln|g| (a vectorized logf, sidco_passes.h);
//      the paper's gamma fit without exclude_zeros needs the mean inside the
//      log, ln(|g| + eps * mean), and takes a second pass;
//   2. one pass copies the elements above the stage-1 threshold (values and
//      int32 positions, ascending) into scratch segments, one per thread;
//   3. each later stage fits the survivors' moments (a pass over the
//      segments only) and compacts them in place.
//
// The closed-form estimators, the stage ratios, the sampled nonzero count of
// exclude_zeros and the "at least one element unless all zero" rule are those
// of thresholds.py / base.py, in the same order; the sums are taken in
// another order (float blocks added into doubles here, float32 trees in
// TensorFlow), so the thresholds agree to float32 reduction-order tolerance,
// and the positions are exactly those with |g| > float(threshold).
// Whole-tensor passes are split over at most num_threads parts of TensorFlow's
// intra-op pool. sidco_estimators.h holds the closed forms, sidco_passes.h
// the vectorized passes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "sidco_estimators.h"
#include "sidco_passes.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TfsparseSidco")
    .Input("flat: T")
    .Input("stages: int32")
    .Input("ratio: float64")
    .Input("first_ratio: float64")
    .Output("values: T")
    .Output("indices: int32")
    .Output("threshold: float64")
    .Attr("T: {float, double}")
    .Attr("distribution: {'exponential', 'gpareto', 'gamma'}")
    .Attr("exclude_zeros: bool")
    .Attr("exact_count_limit: int")
    .Attr("sample_chunk: int")
    .Attr("sample_chunks: int")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle flat;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &flat));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    });

namespace {

using namespace tfsparse_sidco;  // NOLINT

enum class Distribution { kExponential, kGpareto, kGamma };

// Reused scratch: one per concurrently running op (usually one), so the
// segments' memory is not faulted in again on every call.
template <typename T>
struct Scratch {
  std::vector<Segment<T>> segments;
};

template <typename T>
class ScratchPool {
 public:
  static ScratchPool* Get() {
    static ScratchPool* pool = new ScratchPool;  // never destroyed
    return pool;
  }
  std::unique_ptr<Scratch<T>> Acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<Scratch<T>>();
    std::unique_ptr<Scratch<T>> scratch = std::move(free_.back());
    free_.pop_back();
    return scratch;
  }
  void Release(std::unique_ptr<Scratch<T>> scratch) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(scratch));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Scratch<T>>> free_;
};

// Parts of at least this many elements are worth a thread (on 2 busy cores
// a second thread did not pay below that, not even for the gamma fit's logs).
constexpr int64_t kMinPart = 1 << 20;

template <typename T>
class SidcoOp : public OpKernel {
 public:
  explicit SidcoOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string distribution;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distribution", &distribution));
    distribution_ = distribution == "exponential" ? Distribution::kExponential
                    : distribution == "gpareto"   ? Distribution::kGpareto
                                                  : Distribution::kGamma;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("exclude_zeros", &exclude_zeros_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("exact_count_limit", &exact_count_limit_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_chunk", &sample_chunk_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sample_chunks", &sample_chunks_));
    OP_REQUIRES(ctx, sample_chunk_ >= 1 && sample_chunks_ >= 1,
                errors::InvalidArgument("sample_chunk and sample_chunks must "
                                        "be positive"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& flat = ctx->input(0);
    OP_REQUIRES(ctx, flat.dims() == 1,
                errors::InvalidArgument("flat must be 1-D, got shape ",
                                        flat.shape().DebugString()));
    OP_REQUIRES(ctx,
                flat.NumElements() <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("flat has more than 2**31 - 1 "
                                        "elements"));
    const int64_t stages = std::max<int64_t>(ctx->input(1).scalar<int32_t>()(), 1);
    const double ratio = ctx->input(2).scalar<double>()();
    const double first_ratio = ctx->input(3).scalar<double>()();
    OP_REQUIRES(ctx, ratio > 0 && ratio <= 1 && first_ratio > 0 &&
                         first_ratio <= 1,
                errors::InvalidArgument("ratio and first_ratio must be in "
                                        "(0, 1], got ", ratio, " and ",
                                        first_ratio));
    const T* x = flat.flat<T>().data();
    const int64_t n = flat.NumElements();

    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t parts = std::max<int64_t>(
        1, std::min<int64_t>(workers.num_threads, n / kMinPart));
    const int64_t part_size = (n + parts - 1) / parts;
    auto in_parallel = [&](const std::function<void(int64_t)>& fn) {
      if (parts == 1) return fn(0);
      Shard(parts, workers.workers, parts, /*cost_per_unit=*/1 << 30,
            [&](int64_t begin, int64_t end) {
              for (int64_t p = begin; p < end; ++p) fn(p);
            });
    };
    auto part_begin = [&](int64_t p) { return std::min(n, p * part_size); };
    auto part_end = [&](int64_t p) { return std::min(n, (p + 1) * part_size); };

    // Pass 1: the sums of the first-stage fit.
    const bool gamma = distribution_ == Distribution::kGamma;
    const bool gpareto = distribution_ == Distribution::kGpareto;
    const bool exact_count = exclude_zeros_ && n <= exact_count_limit_;
    const bool logs_now = gamma && exclude_zeros_;
    std::vector<Sums> part_sums(parts);
    in_parallel([&](int64_t p) {
      part_sums[p] = RangeSums<T>(x, part_begin(p), part_end(p), gpareto,
                                  exact_count, logs_now, T(0));
    });
    Sums sums;
    for (const Sums& s : part_sums) sums.Add(s);

    // thresholds.multistage_threshold, step by step.
    double count = static_cast<double>(n);
    double fit_ratio = ratio;
    if (exclude_zeros_) {
      count = exact_count ? static_cast<double>(sums.nonzero)
                          : SampledNonzero(x, n);
      fit_ratio = std::min(ratio * static_cast<double>(n) /
                               std::max(count, 1.0), 1.0);
    }
    const bool single = stages <= 1 || fit_ratio >= first_ratio;
    const double first = single ? fit_ratio : first_ratio;
    const double later =
        single ? 1.0
               : std::pow(fit_ratio / first_ratio,
                          1.0 / std::max<double>(stages - 1, 1));
    const int64_t n_later = fit_ratio < first_ratio ? stages - 1 : 0;

    const double fit_count = std::max(count, 1.0);
    const double mean = sums.sum / fit_count;
    double eta = 0;
    if (distribution_ == Distribution::kExponential) {
      eta = ExponentialThreshold(mean, first);
    } else if (gpareto) {
      const double variance =
          std::max(sums.squares / fit_count - mean * mean, 0.0);
      eta = GparetoThreshold(mean, variance, first);
    } else {
      // s = ln(mean) - mean(ln x): over the nonzeros (exclude_zeros; zeros
      // add ln(mean) - ln(mean) = 0 in thresholds.py), or over all of
      // x + eps * mean (a second pass, now that the mean is known).
      const double safe_mean = mean > 0 ? mean : 1.0;
      // ln(mean) by the same log as the elements (float32 for float32, as
      // thresholds.py), so constant magnitudes give s = 0 exactly.
      const double log_mean = FastLog(static_cast<T>(safe_mean));
      double log_gap;
      if (exclude_zeros_) {
        log_gap =
            -(sums.logs - static_cast<double>(sums.positive) * log_mean) /
            fit_count;
      } else {
        const T offset = std::numeric_limits<T>::epsilon() *
                         static_cast<T>(safe_mean);
        std::vector<Sums> log_sums(parts);
        in_parallel([&](int64_t p) {
          log_sums[p] = RangeSums<T>(x, part_begin(p), part_end(p), false,
                                     false, true, offset);
        });
        double total = 0;
        for (const Sums& s : log_sums) total += s.logs;
        log_gap = log_mean - total / fit_count;
      }
      eta = GammaThreshold(mean, std::max(log_gap, 0.0), first);
    }
    if (!(mean > 0)) eta = 0;

    // Pass 2: the survivors of stage 1; later stages refit on them only.
    std::unique_ptr<Scratch<T>> scratch = ScratchPool<T>::Get()->Acquire();
    std::vector<Segment<T>>& segments = scratch->segments;
    if (static_cast<int64_t>(segments.size()) < parts) segments.resize(parts);
    T cut = static_cast<T>(eta);
    in_parallel([&](int64_t p) {
      SelectRange<T>(x, part_begin(p), part_end(p), cut, &segments[p]);
    });
    const bool exponential_later =
        distribution_ == Distribution::kExponential;
    for (int64_t stage = 0; stage < n_later; ++stage) {
      Excess excess;
      for (int64_t p = 0; p < parts; ++p) AddExcess(segments[p], cut, &excess);
      if (excess.count == 0) break;  // eta stays, and so would every later stage
      // Moments of x - low, from the excess over the threshold actually
      // compared with (cut; thresholds.py subtracts eta, which differs from
      // it by float rounding).
      const double m = static_cast<double>(excess.count);
      const double mean_excess = excess.sum / m;
      const double variance =
          std::max(excess.squares / m - mean_excess * mean_excess, 0.0);
      const double shifted_mean =
          mean_excess - (excess.low - static_cast<double>(cut));
      double shifted = exponential_later
                           ? ExponentialThreshold(shifted_mean, later)
                           : GparetoThreshold(shifted_mean, variance, later);
      if (!(shifted_mean > 0)) shifted = 0;
      eta = shifted + excess.low;
      const T next = static_cast<T>(eta);
      if (next >= cut) {
        for (int64_t p = 0; p < parts; ++p) FilterSegment(next, &segments[p]);
      } else {  // not expected (eta >= low > cut); NaN selects nothing
        in_parallel([&](int64_t p) {
          SelectRange<T>(x, part_begin(p), part_end(p), next, &segments[p]);
        });
      }
      cut = next;
    }

    int64_t total = 0;
    for (int64_t p = 0; p < parts; ++p) total += segments[p].count;
    int64_t fallback = -1;
    if (total == 0 && n > 0) {
      // select_above: the largest, unless all are zero (or one is NaN:
      // tf.reduce_max is then NaN, and NaN > 0 is false).
      T best = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T a = std::fabs(x[i]);
        if (std::isnan(a)) {
          fallback = -1;
          break;
        }
        if (a > best) {
          best = a;
          fallback = i;
        }
      }
      total = fallback >= 0 ? 1 : 0;
    }
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &values));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(1, TensorShape({total}), &indices));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &threshold));
    threshold->scalar<double>()() = eta;
    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    if (fallback >= 0) {
      out_values[0] = x[fallback];
      out_indices[0] = static_cast<int32_t>(fallback);
    } else {
      int64_t offset = 0;
      for (int64_t p = 0; p < parts; ++p) {
        const Segment<T>& s = segments[p];
        std::copy_n(s.values.data(), s.count, out_values + offset);
        std::copy_n(s.indices.data(), s.count, out_indices + offset);
        offset += s.count;
      }
    }
    ScratchPool<T>::Get()->Release(std::move(scratch));
  }

 private:
  // thresholds.nonzero_count above exact_count_limit: the nonzero fraction
  // of evenly spaced chunks (odd stride), times the size.
  double SampledNonzero(const T* x, int64_t n) const {
    const int64_t stride =
        std::max<int64_t>(n / (sample_chunk_ * sample_chunks_), 1) / 2 * 2 + 1;
    int64_t seen = 0, nonzero = 0;
    for (int64_t start = 0; start < n - sample_chunk_ + 1;
         start += stride * sample_chunk_) {
      for (int64_t j = 0; j < sample_chunk_; ++j) {
        nonzero += std::fabs(x[start + j]) != T(0) ? 1 : 0;
      }
      seen += sample_chunk_;
    }
    return static_cast<double>(nonzero) / static_cast<double>(seen) *
           static_cast<double>(n);
  }

  Distribution distribution_;
  bool exclude_zeros_;
  int64_t exact_count_limit_;
  int64_t sample_chunk_;
  int64_t sample_chunks_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSidco").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SidcoOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSidco").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SidcoOp<double>);
