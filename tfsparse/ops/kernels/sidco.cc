// TfsparseSidco: SIDCo's threshold estimation and selection, fused.
//
// The pure-TensorFlow path (tfsparse/compression/thresholds.py and
// select_above in tfsparse/compression/base.py) runs a dozen whole-tensor
// passes (abs, sums, masks, tf.where, gather) plus per-op overhead. This op
// computes the same estimate in as few passes as possible:
//
//   1. one pass accumulates sum |g|, and as the fit needs: sum g^2, the
//      nonzero count, sum ln|g| (binary exponents plus the log of a running
//      mantissa product, sidco_passes.h); the paper's gamma fit without
//      exclude_zeros needs the mean inside the log, ln(|g| + eps * mean),
//      and takes a second pass;
//   2. one pass copies the elements above the stage-1 threshold (values and
//      int32 positions, ascending) into scratch segments, one per thread
//      (16- or 8-lane compaction or bit scans, by the expected fraction
//      kept). From 2^18 elements the same fit on a 3% sample (at twice the
//      ratio) gives a lower threshold first, and pass 1, run chunk by chunk,
//      also copies each chunk's elements above it while the chunk is in
//      cache; pass 2 then filters those copies only (a full pass again if
//      the sample misled: the selection is the same either way). On 10M
//      elements, from memory, that took 30% off the two passes;
//   3. each later stage fits the survivors' moments (a pass over the
//      segments only) and compacts them in place.
//
// The closed-form estimators, the stage ratios, the sampled nonzero count of
// exclude_zeros and the "at least one element unless all zero" rule are those
// of thresholds.py / base.py, in the same order; the sums are taken in
// another order (float blocks added into doubles here, float32 trees in
// TensorFlow), so the thresholds agree to float32 reduction-order tolerance,
// and the positions are exactly those with |g| > float(threshold). One
// deliberate difference: constant magnitudes give the gamma fit s = 0
// exactly here (as exact arithmetic), where TensorFlow's rounded mean can
// leave s ~ 1e-8 and move the threshold by up to ~1e-2 relative.
// Whole-tensor passes are split over at most num_threads parts of TensorFlow's
// intra-op pool. sidco_estimators.h holds the closed forms,
// sidco_passes_variant.inc the vectorized passes, compiled once per
// instruction-set variant (variants.inc); the op's "isa" attribute picks one
// (isa.h).
//
// TfsparseSidcoAdaptive is the same selection for an adaptive SIDCo: it
// reads the stage count from SIDCo's variables and, after selecting, updates
// them in place with the adaptive-stage rule (sidco_adaptation.h, a copy of
// SIDCo._observe), so a compress call is one op instead of a read, the op,
// and a dozen small ops with a tf.cond and six variable updates.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "isa.h"
#include "sidco_adaptation.h"
#include "sidco_estimators.h"
#include "sidco_passes.h"

using namespace tensorflow;  // NOLINT

// Both ops: a 1-D gradient in, the selected values and indices (their count
// known only at run time) and the threshold out.
static absl::Status SidcoShape(shape_inference::InferenceContext* c) {
  shape_inference::ShapeHandle flat;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &flat));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->Scalar());
  return absl::OkStatus();
}

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
    .Attr("isa: string = ''")
    .SetShapeFn(SidcoShape);

REGISTER_OP("TfsparseSidcoAdaptive")
    .Input("flat: T")
    .Input("stages: resource")
    .Input("adaptation: resource")
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
    .Attr("max_stages: int >= 1")
    .Attr("adapt_every: int >= 1")
    .Attr("band_low: float")
    .Attr("band_high: float")
    .Attr("memory: int")
    .Attr("isa: string = ''")
    .SetIsStateful()
    .SetShapeFn(SidcoShape);

#define TFSPARSE_VARIANT_SOURCE "sidco_passes_variant.inc"
#include "variants.inc"

namespace {

using namespace tfsparse_sidco;  // NOLINT
using tfsparse::Isa;

template <typename T>
Passes<T> PassesFor(Isa isa) {
  TFSPARSE_DISPATCH(isa, SidcoPasses<T>);
}

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

// OP_REQUIRES for a function that returns -1 on errors.
#define SIDCO_REQUIRES(CTX, EXP, STATUS)               \
  do {                                                 \
    if (!TF_PREDICT_TRUE(EXP)) {                       \
      (CTX)->CtxFailure(__FILE__, __LINE__, (STATUS)); \
      return -1;                                       \
    }                                                  \
  } while (0)

// Parts of at least this many elements are worth a thread (on 2 busy cores
// a second thread did not pay below that, not even for the gamma fit's logs).
constexpr int64_t kMinPart = 1 << 20;

// Pass 1 runs over chunks of kChunk elements (128 KiB of float32, in the L2
// cache), each selected above the guess right after its sums when there is
// one. The guess is fitted to kSampleChunks chunks of kSumBlock elements,
// at kGuessWiden times stage 1's ratio (at ratio 0.01 a threshold 15% lower
// on exponential magnitudes, at 0.001 10%), from kMinGuessed elements and
// when it keeps at most kMaxGuessed of them.
constexpr int64_t kChunk = 16 * kSumBlock;
constexpr int64_t kSampleChunks = 16;
constexpr double kGuessWiden = 2.0;
constexpr int64_t kMinGuessed = 1 << 18;
constexpr double kMaxGuessed = 0.05;

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
    int64_t sampled = 0;  // their product, the divisor of the sample's stride
    OP_REQUIRES(ctx, sample_chunk_ >= 1 && sample_chunks_ >= 1 &&
                         !__builtin_mul_overflow(sample_chunk_, sample_chunks_, &sampled),
                errors::InvalidArgument("sample_chunk and sample_chunks must "
                                        "be positive with a product that fits "
                                        "int64, got ", sample_chunk_, " and ",
                                        sample_chunks_));
    Isa isa = Isa::kPortable;
    OP_REQUIRES_OK(ctx, tfsparse::IsaFromAttr(ctx, &isa));
    passes_ = PassesFor<T>(isa);
  }

  void Compute(OpKernelContext* ctx) override {
    Select(ctx, ctx->input(1).scalar<int32_t>()(),
           ctx->input(2).scalar<double>()(), ctx->input(3).scalar<double>()());
  }

 protected:
  // Selects from input 0 with `stages` stages into outputs 0 to 2; returns
  // the number of elements sent (-1 after an error, set on ctx).
  int64_t Select(OpKernelContext* ctx, int64_t stages, double ratio,
                 double first_ratio) {
    const Tensor& flat = ctx->input(0);
    SIDCO_REQUIRES(ctx, flat.dims() == 1,
                         errors::InvalidArgument("flat must be 1-D, got shape ",
                                                 flat.shape().DebugString()));
    SIDCO_REQUIRES(
        ctx, flat.NumElements() <= std::numeric_limits<int32_t>::max(),
        errors::InvalidArgument("flat has more than 2**31 - 1 elements"));
    stages = std::max<int64_t>(stages, 1);
    SIDCO_REQUIRES(ctx, ratio > 0 && ratio <= 1 && first_ratio > 0 &&
                                  first_ratio <= 1,
                         errors::InvalidArgument("ratio and first_ratio must "
                                                 "be in (0, 1], got ", ratio,
                                                 " and ", first_ratio));
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

    // Pass 1: the sums of the first-stage fit and, when a sample of x gives
    // a threshold safely below stage 1's, the elements above that guess,
    // taken chunk by chunk while the chunk is in cache (pass 2 then only
    // filters them). The sums are the same either way.
    const bool gamma = distribution_ == Distribution::kGamma;
    const bool gpareto = distribution_ == Distribution::kGpareto;
    const bool exact_count = exclude_zeros_ && n <= exact_count_limit_;
    const bool logs_now = gamma && exclude_zeros_;
    double guess_fraction = 0;
    const T guess = GuessThreshold(x, n, stages, ratio, first_ratio,
                                   &guess_fraction);
    std::unique_ptr<Scratch<T>> scratch = ScratchPool<T>::Get()->Acquire();
    std::vector<Segment<T>>& segments = scratch->segments;
    if (static_cast<int64_t>(segments.size()) < parts) segments.resize(parts);
    std::vector<Sums> part_sums(parts);
    in_parallel([&](int64_t p) {
      Segment<T>* candidates = guess > T(0) ? &segments[p] : nullptr;
      if (candidates != nullptr) candidates->count = 0;
      for (int64_t b = part_begin(p); b < part_end(p); b += kChunk) {
        const int64_t e = std::min(part_end(p), b + kChunk);
        part_sums[p].Add(passes_.range_sums(x, b, e, gpareto, exact_count,
                                            logs_now, T(0)));
        if (candidates != nullptr) {
          passes_.select_range(x, b, e, guess, candidates, guess_fraction);
        }
      }
    });
    Sums sums;
    for (const Sums& s : part_sums) sums.Add(s);

    // The gamma fit without exclude_zeros: a pass over all of x.
    auto offset_logs = [&](T offset) {
      std::vector<Sums> log_sums(parts);
      in_parallel([&](int64_t p) {
        log_sums[p] = passes_.range_sums(x, part_begin(p), part_end(p), false,
                                         false, true, offset);
      });
      Sums logs;
      for (const Sums& s : log_sums) logs.Add(s);
      return logs;
    };
    const double count =
        !exclude_zeros_ ? static_cast<double>(n)
        : exact_count   ? static_cast<double>(sums.nonzero)
                        : SampledNonzero(x, n);
    auto scaled_squares = [&](T scale) {
      std::vector<double> part_squares(parts);
      in_parallel([&](int64_t p) {
        part_squares[p] =
            passes_.scaled_squares(x, part_begin(p), part_end(p), scale);
      });
      double squares = 0;
      for (double q : part_squares) squares += q;
      return squares;
    };
    const Stage1 fit = FitStage1(x, sums, n, count, stages, ratio, first_ratio,
                                 1.0, offset_logs, scaled_squares, true);
    double eta = fit.eta;

    // Pass 2: the survivors of stage 1; later stages refit on them only.
    T cut = static_cast<T>(eta);
    if (guess > T(0) && cut >= guess) {  // NaN never is
      for (int64_t p = 0; p < parts; ++p) {
        passes_.filter_segment(cut, &segments[p]);
      }
    } else {
      // The fraction of all elements stage 1 should keep (the fit's ratio of
      // its `count` elements): it picks the compaction, nothing else.
      const double expected = fit.first * count / std::max<double>(n, 1);
      in_parallel([&](int64_t p) {
        segments[p].count = 0;
        passes_.select_range(x, part_begin(p), part_end(p), cut, &segments[p],
                             expected);
      });
    }
    const double later = fit.later;
    const int64_t n_later = fit.n_later;
    const bool exponential_later =
        distribution_ == Distribution::kExponential;
    for (int64_t stage = 0; stage < n_later; ++stage) {
      // The moments of the excess times excess_scale: 1 unless the threshold
      // is a float64 far from 1 (ScaleFor).
      const double excess_scale = ScaleFor(static_cast<double>(cut));
      Excess excess;
      for (int64_t p = 0; p < parts; ++p) {
        passes_.add_excess(segments[p], cut, static_cast<T>(excess_scale),
                           &excess);
      }
      if (excess.count == 0) break;  // eta stays, and so would every later stage
      // Moments of x - low, from the excess over the threshold actually
      // compared with (cut; thresholds.py subtracts eta, which differs from
      // it by float rounding).
      const double m = static_cast<double>(excess.count);
      const double mean_excess = excess.sum / m;
      const double variance =
          std::max(excess.squares / m - mean_excess * mean_excess, 0.0);
      const double shifted_mean =
          mean_excess - (excess.low - static_cast<double>(cut)) * excess_scale;
      double shifted = exponential_later
                           ? ExponentialThreshold(shifted_mean, later)
                           : GparetoThreshold(shifted_mean, variance, later);
      if (!(shifted_mean > 0)) shifted = 0;
      eta = shifted / excess_scale + excess.low;
      const T next = static_cast<T>(eta);
      if (next >= cut) {
        for (int64_t p = 0; p < parts; ++p) {
          passes_.filter_segment(next, &segments[p]);
        }
      } else {  // not expected (eta >= low > cut); NaN selects nothing
        in_parallel([&](int64_t p) {
          segments[p].count = 0;
          passes_.select_range(x, part_begin(p), part_end(p), next,
                               &segments[p], 1.0);
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
    const auto release = [&] {
      ScratchPool<T>::Get()->Release(std::move(scratch));
    };
    for (int output = 0; output < 3; ++output) {
      Tensor** tensor = output == 0 ? &values : output == 1 ? &indices : &threshold;
      const absl::Status status = ctx->allocate_output(
          output, output < 2 ? TensorShape({total}) : TensorShape({}), tensor);
      if (!status.ok()) {
        release();
        ctx->SetStatus(status);
        return -1;
      }
    }
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
    release();
    return total;
  }

 private:
  // thresholds.multistage_threshold up to stage 1: its ratio, the later
  // stages' ratio and number, and stage 1's threshold.
  struct Stage1 {
    double eta = 0;
    double first = 1;  // of the fitted count
    double later = 1;
    int64_t n_later = 0;
    bool constant = false;  // the gamma fit saw constant magnitudes
  };

  // Stage 1 fitted to pass 1's `sums` over n elements, of which `count` are
  // fitted (the nonzeros with exclude_zeros, else n), its threshold taken at
  // `widen` times stage 1's ratio. offset_logs(offset) sums ln(|x| + offset)
  // over the same elements (the gamma fit without exclude_zeros); `exact`
  // fits constant magnitudes exactly (x is then all of the op's input).
  // scaled_squares(scale) sums (|x| * scale)^2 over the same elements: the
  // gpareto fit of float64 magnitudes far from 1 (ScaleFor) is made in units
  // of a power of two near the mean, with the squares taken again.
  Stage1 FitStage1(const T* x, const Sums& sums, int64_t n, double count,
                   int64_t stages, double ratio, double first_ratio,
                   double widen, const std::function<Sums(T)>& offset_logs,
                   const std::function<double(T)>& scaled_squares,
                   bool exact) const {
    Stage1 out;
    double fit_ratio = ratio;
    if (exclude_zeros_) {
      fit_ratio = std::min(ratio * static_cast<double>(n) /
                               std::max(count, 1.0), 1.0);
    }
    const bool single = stages <= 1 || fit_ratio >= first_ratio;
    out.first = single ? fit_ratio : first_ratio;
    out.later = single ? 1.0
                       : std::pow(fit_ratio / first_ratio,
                                  1.0 / std::max<double>(stages - 1, 1));
    out.n_later = fit_ratio < first_ratio ? stages - 1 : 0;
    const double first = std::min(out.first * widen, 1.0);

    const double fit_count = std::max(count, 1.0);
    double mean = sums.sum / fit_count;
    double eta = 0;
    if (distribution_ == Distribution::kExponential) {
      eta = ExponentialThreshold(mean, first);
    } else if (distribution_ == Distribution::kGpareto) {
      // The squares and the variance stay in double's range in these units.
      const double scale = ScaleFor(mean);
      const double squares =
          scale == 1 ? sums.squares : scaled_squares(static_cast<T>(scale));
      const double scaled_mean = mean * scale;
      const double variance =
          std::max(squares / fit_count - scaled_mean * scaled_mean, 0.0);
      eta = GparetoThreshold(scaled_mean, variance, first) / scale;
    } else {
      // s = ln(mean) - mean(ln x): over the nonzeros (exclude_zeros; zeros
      // add ln(mean) - ln(mean) = 0 in thresholds.py), or over all of
      // x + eps * mean (a second pass, now that the mean is known).
      const double safe_mean = mean > 0 ? mean : 1.0;
      // ln(mean) by the same log as the elements (float32 for float32, as
      // thresholds.py).
      const double log_mean = FastLog(static_cast<T>(safe_mean));
      double log_gap;
      Sums logs = sums;
      if (exclude_zeros_) {
        log_gap =
            -(sums.logs - static_cast<double>(sums.positive) * log_mean) /
            fit_count;
      } else {
        logs = offset_logs(std::numeric_limits<T>::epsilon() *
                           static_cast<T>(safe_mean));
        log_gap = log_mean - logs.logs / fit_count;
      }
      // Constant magnitudes: s = 0 exactly, whatever the rounding of the
      // sums and of the mean (near s = 0 the quantile moves like sqrt(s):
      // s = 1e-11 would show at 2.5e-5), as in exact arithmetic; and the
      // mean is that magnitude exactly (float block sums of one repeated
      // value drift by up to ~1e-5 relative, by how many terms a vector
      // lane adds, so the variants would disagree). With exclude_zeros the
      // log arguments are the nonzero magnitudes themselves; a sampled
      // nonzero count keeps the estimator's own mean.
      if (logs.low == logs.high) {
        out.constant = true;
        log_gap = 0;
        if (exact && exclude_zeros_ && n <= exact_count_limit_) {
          mean = logs.low;
        } else if (exact && !exclude_zeros_ && AllMagnitudesEqual(x, n)) {
          mean = std::fabs(static_cast<double>(x[0]));
        }
      }
      eta = GammaThreshold(mean, std::max(log_gap, 0.0), first);
    }
    out.eta = mean > 0 ? eta : 0;
    return out;
  }

  // Pass 1's guess: stage 1's threshold fitted to kSampleChunks chunks of
  // kSumBlock elements spread evenly over x, at kGuessWiden times its
  // ratio, so that it lies below the threshold fitted to all of x unless
  // the sample misleads (pass 2 is then a full pass, as without a guess).
  // 0 (no guess) below kMinGuessed elements, for constant sampled
  // magnitudes, or when it would keep more than kMaxGuessed of x; the
  // fraction of x it should keep in `fraction`.
  T GuessThreshold(const T* x, int64_t n, int64_t stages, double ratio,
                   double first_ratio, double* fraction) const {
    *fraction = 0;
    if (n < kMinGuessed) return T(0);
    const bool gamma = distribution_ == Distribution::kGamma;
    const bool gpareto = distribution_ == Distribution::kGpareto;
    auto chunk_begin = [&](int64_t j) {
      return (n - kSumBlock) * j / (kSampleChunks - 1);
    };
    auto sample_sums = [&](bool squares, bool count, bool logs, T offset) {
      Sums sums;
      for (int64_t j = 0; j < kSampleChunks; ++j) {
        const int64_t begin = chunk_begin(j);
        sums.Add(passes_.range_sums(x, begin, begin + kSumBlock, squares,
                                    count, logs, offset));
      }
      return sums;
    };
    const Sums sums =
        sample_sums(gpareto, exclude_zeros_, gamma && exclude_zeros_, T(0));
    const int64_t size = kSampleChunks * kSumBlock;
    const double count = exclude_zeros_ ? static_cast<double>(sums.nonzero)
                                        : static_cast<double>(size);
    auto scaled_squares = [&](T scale) {
      double squares = 0;
      for (int64_t j = 0; j < kSampleChunks; ++j) {
        const int64_t begin = chunk_begin(j);
        squares += passes_.scaled_squares(x, begin, begin + kSumBlock, scale);
      }
      return squares;
    };
    const Stage1 fit = FitStage1(
        x, sums, size, count, stages, ratio, first_ratio, kGuessWiden,
        [&](T offset) { return sample_sums(false, false, true, offset); },
        scaled_squares, false);
    *fraction = std::min(fit.first * kGuessWiden, 1.0) * count /
                static_cast<double>(size);
    if (fit.constant || *fraction > kMaxGuessed || !(fit.eta > 0)) return T(0);
    return static_cast<T>(fit.eta);
  }

  // Whether every |x[i]| equals |x[0]| (stops at the first that does not).
  static bool AllMagnitudesEqual(const T* x, int64_t n) {
    for (int64_t i = 1; i < n; ++i) {
      if (std::fabs(x[i]) != std::fabs(x[0])) return false;
    }
    return n > 0;
  }

  // thresholds.nonzero_count above exact_count_limit: the nonzero fraction
  // of evenly spaced chunks (odd stride), times the size. A tensor shorter
  // than a chunk (an exact_count_limit below sample_chunk) has no chunk to
  // sample, so it is counted whole.
  double SampledNonzero(const T* x, int64_t n) const {
    if (n < sample_chunk_) {
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; ++i) nonzero += std::fabs(x[i]) != T(0) ? 1 : 0;
      return static_cast<double>(nonzero);
    }
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

  Passes<T> passes_;
  Distribution distribution_;
  bool exclude_zeros_;
  int64_t exact_count_limit_;
  int64_t sample_chunk_;
  int64_t sample_chunks_;
};

// An initialized variable of `dtype` and `shape`, for the adaptive op.
absl::Status CheckVariable(Var* var, DataType dtype, const TensorShape& shape,
                           const char* name) {
  if (!var->is_initialized) {
    return errors::FailedPrecondition("SIDCo's ", name,
                                      " variable is not initialized");
  }
  const Tensor& tensor = *var->tensor();
  if (tensor.dtype() != dtype || tensor.shape() != shape) {
    return errors::InvalidArgument(
        "SIDCo's ", name, " variable must be ", DataTypeString(dtype), " ",
        shape.DebugString(), ", got ", DataTypeString(tensor.dtype()), " ",
        tensor.shape().DebugString());
  }
  return absl::OkStatus();
}

// The variable's tensor, to be written in place (with its lock held): when
// a reader still holds the buffer (a ReadVariableOp aliases it), a copy
// replaces it first, as TensorFlow's assign ops do.
absl::Status WritableTensor(OpKernelContext* ctx, Var* var, Tensor** out) {
  Tensor* tensor = var->tensor();
  if (!tensor->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
    std::memcpy(copy.data(), tensor->data(), tensor->TotalBytes());
    *tensor = copy;
  }
  *out = tensor;
  return absl::OkStatus();
}

// TfsparseSidcoAdaptive: SidcoOp with the stage count read from SIDCo's
// `stages` variable, then the adaptive-stage rule applied to it and to the
// `adaptation` variable (SIDCo._observe).
template <typename T>
class SidcoAdaptiveOp : public SidcoOp<T> {
 public:
  explicit SidcoAdaptiveOp(OpKernelConstruction* ctx) : SidcoOp<T>(ctx) {
    int64_t max_stages = 0, adapt_every = 0, memory = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_stages", &max_stages));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("adapt_every", &adapt_every));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("memory", &memory));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("band_low", &rule_.band_low));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("band_high", &rule_.band_high));
    OP_REQUIRES(ctx, max_stages <= (1 << 20),
                errors::InvalidArgument("max_stages too large: ", max_stages));
    rule_.max_stages = static_cast<int32_t>(max_stages);
    rule_.adapt_every = static_cast<int32_t>(adapt_every);
    rule_.memory = static_cast<int32_t>(memory);
  }

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Var> stages_var, adaptation_var;
    OP_REQUIRES_OK(ctx,
                   LookupResource(ctx, HandleFromInput(ctx, 1), &stages_var));
    OP_REQUIRES_OK(
        ctx, LookupResource(ctx, HandleFromInput(ctx, 2), &adaptation_var));
    const TensorShape scalar({});
    const TensorShape vector({AdaptationSize(rule_.max_stages)});
    int32_t stages = 0;
    {
      tf_shared_lock lock(*stages_var->mu());
      OP_REQUIRES_OK(ctx,
                     CheckVariable(stages_var.get(), DT_INT32, scalar, "stages"));
      stages = stages_var->tensor()->scalar<int32_t>()();
    }
    const double ratio = ctx->input(3).scalar<double>()();
    const int64_t sent =
        this->Select(ctx, stages, ratio, ctx->input(4).scalar<double>()());
    if (sent < 0) return;
    // Compressor.target_count: max(round(n * ratio), min(n, 1)), rounding
    // half to even as tf.round.
    const double n = static_cast<double>(ctx->input(0).NumElements());
    const int64_t target = static_cast<int64_t>(
        std::max(std::nearbyint(n * ratio), std::min(n, 1.0)));

    // Both variables locked in order of increasing mutex address.
    mutex* first = stages_var->mu();
    mutex* second = adaptation_var->mu();
    OP_REQUIRES(ctx, first != second,
                errors::InvalidArgument("stages and adaptation must be two "
                                        "variables"));
    if (second < first) std::swap(first, second);
    mutex_lock first_lock(*first);
    mutex_lock second_lock(*second);
    OP_REQUIRES_OK(ctx,
                   CheckVariable(stages_var.get(), DT_INT32, scalar, "stages"));
    OP_REQUIRES_OK(ctx, CheckVariable(adaptation_var.get(), DT_DOUBLE, vector,
                                      "adaptation"));
    int32_t count = stages_var->tensor()->scalar<int32_t>()();
    std::vector<double> state(
        adaptation_var->tensor()->flat<double>().data(),
        adaptation_var->tensor()->flat<double>().data() + vector.dim_size(0));
    OP_REQUIRES(ctx, Observe(sent, target, rule_, &count, state.data()),
                errors::InvalidArgument(
                    "SIDCo's stage count must lie in [0, ", rule_.max_stages,
                    "] when it adapts, got ", count));
    Tensor* adaptation = nullptr;
    OP_REQUIRES_OK(ctx, WritableTensor(ctx, adaptation_var.get(), &adaptation));
    std::copy(state.begin(), state.end(), adaptation->flat<double>().data());
    if (count != stages_var->tensor()->scalar<int32_t>()()) {
      Tensor* stage_tensor = nullptr;
      OP_REQUIRES_OK(ctx, WritableTensor(ctx, stages_var.get(), &stage_tensor));
      stage_tensor->scalar<int32_t>()() = count;
    }
  }

 private:
  AdaptationRule rule_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSidco").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SidcoOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSidco").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SidcoOp<double>);
REGISTER_KERNEL_BUILDER(Name("TfsparseSidcoAdaptive")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<float>("T"),
                        SidcoAdaptiveOp<float>);
REGISTER_KERNEL_BUILDER(Name("TfsparseSidcoAdaptive")
                            .Device(DEVICE_CPU)
                            .TypeConstraint<double>("T"),
                        SidcoAdaptiveOp<double>);
