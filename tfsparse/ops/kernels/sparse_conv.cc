// Direct sparse 2-D convolution on the kernel's nonzeros (tfsparse/ops/conv.py).
//
// The kernel (kh, kw, C, F) is given as its im2col matrix's nonzeros: row
// r = (i * kw + j) * C + c, column f, value v. Tensors are channels last, as
// Conv2D's, and padding ("VALID" or "SAME", as Conv2D) is applied here:
//
//   TfsparseSparseConvForward        x [B, H, W, C], bias -> y [B, OH, OW, F]
//   TfsparseSparseConvBackpropInput  dy [B, OH, OW, F]    -> dx [B, H, W, C]
//   TfsparseSparseConvBackpropValues x, dy                -> dv [nnz], dbias [F]
//
// The forward pass and the input gradient are one correlation
// (sparse_conv_variant.inc): the input gradient is the forward pass of dy
// through the kernel flipped in both taps with C and F swapped, split by
// the stride's phases (one per stride-th row and column of dx, each fed by
// the taps that reach it) so that no zeros are inserted and multiplied.
// Work units are (image, band of output rows) on TensorFlow's intra-op
// pool; the values gradient (with the bias gradient, dy summed per filter)
// splits the batch into groups of images (four per thread) and sums the
// groups' partial gradients at the end.
//
// Memory: no dense kernel and no im2col buffer. Each block of work units
// (a few per thread) allocates the planar copy of one unit's input rows (its
// band plus the taps' halo, zero padded: for the forward pass about one
// image of the input, up to (vectors + taps' extent) / vectors times wider
// with its interleaved columns, and no more than 1 MiB; for the input
// gradient about one image of dy, filled once for all the stride's phases)
// and a tile of channels x (kCells + 1) output vectors (a block and its
// staging: 36 KiB for 64 filters of floats with AVX-512); the values
// gradient, per group of images, one planar image of x and of dy, and
// [groups, nnz + F, lanes] partial sums. Conv2D's own workspace is larger (an
// im2col buffer of kh * kw times the input, or oneDNN's blocked copies of
// the whole input and output).
#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/statusor.h"
#include "tensorflow/core/platform/threadpool.h"
#include "isa.h"
#include "sparse_conv.h"

using namespace tensorflow;  // NOLINT

// A planar buffer [channels][phases][rows][pitch]: the column phases of a
// stride split a row into `phases` rows of every phases-th column.
struct PlanarLayout {
  int64_t channels, phases, rows, pitch;
  int64_t Size() const { return channels * phases * rows * pitch; }
};

// Where FillPlanar puts pixel (h, w): row h * up_h + pad_top - row0,
// column w * up_w + pad_left.
struct Placement {
  int64_t up_h, up_w, pad_top, pad_left, row0;
};

// Where an NHWC output goes: the elements between its images, rows and
// pixels (a stride's phase of the input gradient is every stride-th row and
// pixel of dx).
struct OutputStrides {
  int64_t image, row, pixel;
};

// The nonzeros grouped by output channel (filter, or input channel for the
// input gradient): group g holds terms [start[g], start[g + 1]), each with
// its offset into the planar source, its value and its index in the inputs.
template <typename T>
struct ConvTerms {
  int64_t groups;
  const int64_t* start;
  const int64_t* offset;
  const T* value;
  const int64_t* index;
};

// Where Correlate's output vectors go: vector v of a row starts at
// planar[v * vector_step] and its lane l is output column v * lanes + l,
// or l * vectors + v if interleaved (FillInterleaved's layout).
struct OutputVectors {
  int64_t vector_step;
  bool interleaved;
};

// Memory a work unit reads next (the next unit's input rows), which
// Correlate fetches into the L2 cache while it computes: the next fill then
// finds its input there instead of waiting on memory for it.
struct NextInput {
  const char* begin;
  int64_t bytes;
};

#define TFSPARSE_VARIANT_SOURCE "sparse_conv_variant.inc"
#include "variants.inc"

namespace tfsparse {
namespace conv {
namespace {

template <typename T>
void RunFillPlanar(Isa isa, const T* src, int64_t height, int64_t width, const Placement& at,
                   const PlanarLayout& layout, T* dst) {
  TFSPARSE_DISPATCH(isa, FillPlanar<T>, src, height, width, at, layout, dst);
}

template <typename T>
void RunFillInterleaved(Isa isa, const T* src, int64_t height, int64_t width,
                        const Placement& at, int64_t span, const PlanarLayout& layout, T* dst) {
  TFSPARSE_DISPATCH(isa, FillInterleaved<T>, src, height, width, at, span, layout, dst);
}

template <typename T>
void RunCorrelate(Isa isa, const T* planar, const ConvTerms<T>& terms, const T* bias,
                  int64_t out_rows, int64_t out_width, int64_t row_step, OutputVectors vectors,
                  bool stream, T* tile, T* out, const OutputStrides& out_at,
                  const NextInput& next) {
  TFSPARSE_DISPATCH(isa, Correlate<T>, planar, terms, bias, out_rows, out_width, row_step,
                    vectors, stream, tile, out, out_at, next);
}

template <typename T>
void RunValuesGradient(Isa isa, const T* x_planar, const T* dy_planar,
                       const ConvTerms<T>& terms, int64_t out_rows, int64_t out_width,
                       int64_t row_step, T* dv) {
  TFSPARSE_DISPATCH(isa, ValuesGradient<T>, x_planar, dy_planar, terms, out_rows, out_width,
                    row_step, dv);
}

template <typename T>
void RunAddPlaneSums(Isa isa, const T* planar, int64_t planes, int64_t plane_size, T* sums) {
  TFSPARSE_DISPATCH(isa, AddPlaneSums<T>, planar, planes, plane_size, sums);
}

template <typename T>
int64_t RunLanes(Isa isa) {
  TFSPARSE_DISPATCH(isa, Lanes<T>);
}

// Runs fn(begin, end) over [0, units) on the workers in blocks of about a
// quarter of a thread's share: on a loaded machine a thread the OS
// deschedules then holds back one small block, not half the work, while the
// others take the rest.
void ParallelUnits(const ConvWorkers& workers, int64_t units,
                   const std::function<void(int64_t, int64_t)>& fn) {
  if (units <= 1 || workers.threads <= 1) return fn(0, units);
  workers.parallel_for(units, std::max<int64_t>(1, units / (4 * workers.threads)), fn);
}

// About the cache (L2) a worker thread has to itself: outputs larger than
// all workers' together are stored past the caches (StreamVec).
constexpr int64_t kCacheBytesPerThread = int64_t{1} << 20;

// An uninitialised scratch array (every user overwrites it first), aligned
// to a cache line (the widest vector).
struct FreeScratch {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using ScratchArray = std::unique_ptr<T[], FreeScratch>;
template <typename T>
ScratchArray<T> Scratch(int64_t size) {
  constexpr int64_t kAlign = 64;
  const int64_t bytes = std::max<int64_t>(size, 1) * sizeof(T);
  return ScratchArray<T>(
      static_cast<T*>(std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign)));
}

// A pass's planar copy of its source for one thread: an error when over
// both 1 GiB and 64 times an image of the source (`image` elements; the
// copy holds at most about one image, its rows padded to whole vectors of
// up to 16 lanes and by the dilated kernel), so only a dilated kernel or a
// stride far wider than its input is refused, not a large image; not an
// allocation that fails or a size that overflows. The size in double: its
// factors may each be near 2^62.
template <typename T>
absl::Status CheckScratch(const PlanarLayout& layout, int64_t image) {
  const double bytes = static_cast<double>(layout.channels) * layout.phases * layout.rows *
                       layout.pitch * sizeof(T);
  const double limit =
      std::max(static_cast<double>(int64_t{1} << 30), 64.0 * image * sizeof(T));
  if (bytes <= limit) return absl::OkStatus();
  return errors::InvalidArgument(
      "kernel_size, strides and dilations: each thread's planar copy of its input would take ",
      bytes, " bytes (", layout.rows, " rows of ", layout.pitch,
      " elements per channel), over 1 GiB and 64 times an image of that input");
}

// One spatial axis as Conv2D computes it: output size and padding before.
struct Axis {
  int64_t in, out, kernel, stride, dilation, pad_before;
};

Axis MakeAxis(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, bool same) {
  const int64_t extent = (kernel - 1) * dilation + 1;
  Axis a{in, 0, kernel, stride, dilation, 0};
  if (same) {
    a.out = (in + stride - 1) / stride;
    a.pad_before = std::max<int64_t>((a.out - 1) * stride + extent - in, 0) / 2;
  } else {
    a.out = in >= extent ? (in - extent) / stride + 1 : 0;
  }
  return a;
}

// The nonzeros sorted (stably, by counting) into groups by `key`; those
// with a negative key are left out.
template <typename T>
struct GroupedTerms {
  std::vector<int64_t> start, offset, index;
  std::vector<T> value;

  ConvTerms<T> View() const {
    return ConvTerms<T>{static_cast<int64_t>(start.size()) - 1, start.data(), offset.data(),
                        value.data(), index.data()};
  }

  // Orders each group's terms by offset: a group's terms then read the
  // planar source in one sweep.
  void SortByOffset() {
    std::vector<int64_t> order;
    for (size_t g = 0; g + 1 < start.size(); ++g) {
      order.resize(start[g + 1] - start[g]);
      for (size_t i = 0; i < order.size(); ++i) order[i] = start[g] + i;
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return offset[a] < offset[b]; });
      std::vector<int64_t> o(order.size()), x(order.size());
      std::vector<T> v(order.size());
      for (size_t i = 0; i < order.size(); ++i) {
        o[i] = offset[order[i]];
        x[i] = index[order[i]];
        v[i] = value[order[i]];
      }
      std::copy(o.begin(), o.end(), offset.begin() + start[g]);
      std::copy(x.begin(), x.end(), index.begin() + start[g]);
      std::copy(v.begin(), v.end(), value.begin() + start[g]);
    }
  }
};

template <typename T, typename Key, typename Offset>
GroupedTerms<T> Group(int64_t nnz, int64_t groups, const T* values, Key key, Offset offset) {
  GroupedTerms<T> g;
  g.start.assign(groups + 1, 0);
  for (int64_t k = 0; k < nnz; ++k) {
    if (key(k) >= 0) ++g.start[key(k) + 1];
  }
  for (int64_t o = 0; o < groups; ++o) g.start[o + 1] += g.start[o];
  std::vector<int64_t> next(g.start.begin(), g.start.end() - 1);
  g.offset.resize(g.start[groups]);
  g.index.resize(g.start[groups]);
  g.value.resize(g.start[groups]);
  for (int64_t k = 0; k < nnz; ++k) {
    if (key(k) < 0) continue;
    const int64_t at = next[key(k)]++;
    g.offset[at] = offset(k);
    g.index[at] = k;
    g.value[at] = values == nullptr ? T(0) : values[k];
  }
  return g;
}

// One correlation CorrelateUnits computes from the units' planar source:
// its terms, its output (image 0, row 0) and its size.
template <typename T>
struct CorrelateTarget {
  ConvTerms<T> terms;
  T* out;
  int64_t out_h, out_w;
};

// One call of an op: the settings and the geometry of this call's tensors
// (a kernel may run concurrently, so nothing of a call lives in the kernel).
template <typename T>
class ConvCall {
 public:
  ConvCall(const ConvSettings& settings, Pass pass, const ConvInputs<T>& inputs,
           const ConvOutputs<T>& outputs, const ConvWorkers& workers)
      : pass_(pass), isa_(settings.isa), filters_(settings.filters), same_(settings.same),
        pairs_(settings.pairs), in_(inputs), outputs_(outputs), workers_(workers) {}

  absl::Status Run() {
    // x's shape: given to the input gradient, else x's own.
    const std::vector<int64_t>& shape =
        pass_ == Pass::kBackpropInput ? in_.input_shape : in_.x.shape;
    if (pass_ == Pass::kBackpropInput) {
      TF_RETURN_IF_ERROR(CheckInputShape(shape));
    } else if (shape.size() != 4) {
      return errors::InvalidArgument("x must be 4-D [B, H, W, C]");
    }
    batch_ = shape[0];
    channels_ = shape[3];
    rows_ = MakeAxis(shape[1], pairs_[0][0], pairs_[1][0], pairs_[2][0], same_);
    cols_ = MakeAxis(shape[2], pairs_[0][1], pairs_[1][1], pairs_[2][1], same_);
    TF_RETURN_IF_ERROR(CheckNonzeros());
    if (pass_ != Pass::kForward) {
      const std::vector<int64_t> expected{batch_, rows_.out, cols_.out, filters_};
      if (in_.dy.shape != expected) {
        return errors::InvalidArgument("dy must be [", absl::StrJoin(expected, ", "),
                                       "], got [", absl::StrJoin(in_.dy.shape, ", "), "]");
      }
    }
    if (pass_ == Pass::kForward) return Forward();
    if (pass_ == Pass::kBackpropInput) return BackpropInput();
    return BackpropValues();
  }

 private:
  // The nonzeros' im2col rows and columns.
  const int32_t* Rows() const { return in_.rows.data; }
  const int32_t* Cols() const { return in_.cols.data; }
  // Tap (i, j) and channel of nonzero k.
  int64_t TapRow(int64_t r) const { return r / channels_ / pairs_[0][1]; }
  int64_t TapCol(int64_t r) const { return r / channels_ % pairs_[0][1]; }
  int64_t Channel(int64_t r) const { return r % channels_; }
  // Elements in one image of x (and of dx), and in one of y (and of dy).
  int64_t InputImage() const { return rows_.in * cols_.in * channels_; }
  int64_t OutputImage() const { return rows_.out * cols_.out * filters_; }

  absl::Status CheckNonzeros() {
    nnz_ = in_.rows.size();
    if (in_.rows.shape.size() != 1 || in_.cols.shape.size() != 1 || in_.cols.size() != nnz_ ||
        (pass_ != Pass::kBackpropValues && in_.values.size() != nnz_)) {
      return errors::InvalidArgument("values, rows and cols must be 1-D of equal length");
    }
    const int64_t rows_total = pairs_[0][0] * pairs_[0][1] * channels_;
    for (int64_t k = 0; k < nnz_; ++k) {
      const int32_t r = Rows()[k], c = Cols()[k];
      if (r < 0 || r >= rows_total || c < 0 || c >= filters_) {
        return errors::InvalidArgument("nonzero ", k, " at (", r, ", ", c,
                                       ") is outside the im2col kernel of shape (",
                                       rows_total, ", ", filters_, ")");
      }
    }
    return absl::OkStatus();
  }

  // The planar layout of x for `band` output rows, as the values gradient
  // reads it, and the terms grouped by filter.
  PlanarLayout ForwardLayout(int64_t band, int64_t lanes) const {
    const int64_t vectors = (cols_.out + lanes - 1) / lanes;
    return PlanarLayout{channels_, cols_.stride,
                        (band - 1) * rows_.stride + (rows_.kernel - 1) * rows_.dilation + 1,
                        vectors * lanes + (cols_.kernel - 1) * cols_.dilation / cols_.stride};
  }

  GroupedTerms<T> ForwardTerms(const PlanarLayout& layout, const T* values) const {
    const int32_t* r = Rows();
    return Group<T>(nnz_, filters_, values, [&](int64_t k) { return Cols()[k]; },
                    [&](int64_t k) {
                      const int64_t column = TapCol(r[k]) * cols_.dilation;
                      return ((Channel(r[k]) * layout.phases + column % cols_.stride) *
                                  layout.rows + TapRow(r[k]) * rows_.dilation) *
                                 layout.pitch + column / cols_.stride;
                    });
  }

  // Units of (image, band of `band` output rows) of an output `out_rows`
  // high: bands small enough for every thread to get work.
  int64_t Band(int64_t out_rows, int64_t threads) const {
    const int64_t bands_per_image = std::max<int64_t>(1, (2 * threads + batch_ - 1) / batch_);
    return std::max<int64_t>(1, (out_rows + bands_per_image - 1) / bands_per_image);
  }

  // Fills a unit's planar source: (image, placement with the unit's first
  // row, planar buffer).
  using Fill = std::function<void(const T*, const Placement&, T*)>;

  // Runs fill + Correlate over (image, band) units, the source being `src`
  // [B, src_h, src_w, C']: each unit fills its planar rows once and computes
  // every target's rows [first, first + band) from them, written `out_at`
  // apart.
  void CorrelateUnits(const T* src, int64_t src_h, int64_t src_w,
                      const PlanarLayout& layout, const Fill& fill, Placement at,
                      int64_t band, int64_t row_step, OutputVectors vectors,
                      const std::vector<CorrelateTarget<T>>& targets, const T* bias,
                      const OutputStrides& out_at) {
    int64_t out_h = 0, channels = 0;
    const int64_t lanes = RunLanes<T>(isa_);
    for (const CorrelateTarget<T>& t : targets) {
      if (t.out_w == 0) continue;
      out_h = std::max(out_h, t.out_h);
      channels = std::max(channels, t.terms.groups);
    }
    if (out_h == 0 || batch_ == 0) return;
    const int64_t bands = (out_h + band - 1) / band;
    const int64_t tile_size = channels * (tfsparse::isa_portable::kCells + 1) * lanes;
    const int64_t src_image = src_h * src_w * layout.channels;
    // Planar rows per output row (FillInterleaved's rows hold every channel).
    const int64_t rows_per_out =
        row_step / (layout.pitch * (vectors.interleaved ? layout.channels : 1));
    // An output larger than the workers' caches is written past them.
    const bool stream = batch_ * out_at.image * static_cast<int64_t>(sizeof(T)) >
                        kCacheBytesPerThread * workers_.threads;
    const int64_t units = batch_ * bands;
    // The source rows unit u's fill reads (the placement's inverse, rows
    // clamped to the image).
    const auto input_of = [&](int64_t u) {
      if (u >= units) return NextInput{nullptr, 0};
      const int64_t top = u % bands * band * rows_per_out - at.pad_top;
      const int64_t h0 = std::max<int64_t>(0, top / at.up_h);
      const int64_t h1 = std::min<int64_t>(src_h, (top + layout.rows) / at.up_h + 1);
      const int64_t row_bytes = src_w * layout.channels * static_cast<int64_t>(sizeof(T));
      return NextInput{reinterpret_cast<const char*>(src + u / bands * src_image) + h0 * row_bytes,
                       std::max<int64_t>(0, h1 - h0) * row_bytes};
    };
    ParallelUnits(workers_, units, [&](int64_t begin, int64_t end) {
      auto planar = Scratch<T>(layout.Size() + 2 * lanes);
      auto tile = Scratch<T>(tile_size);
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t b = unit / bands, first = unit % bands * band;
        Placement here = at;
        here.row0 = first * rows_per_out;
        fill(src + b * src_image, here, planar.get());
        // The next unit's input, also past this block of units: the thread
        // that takes it (likely this one) finds it in L2, or L3 if not.
        NextInput next = input_of(unit + 1);
        for (const CorrelateTarget<T>& t : targets) {
          const int64_t rows = std::min(band, t.out_h - first);
          if (rows <= 0 || t.out_w == 0) continue;
          RunCorrelate<T>(isa_, planar.get(), t.terms, bias, rows, t.out_w, row_step, vectors,
                          stream, tile.get(), t.out + b * out_at.image + first * out_at.row,
                          out_at, next);
          next.bytes = 0;  // fetched by the first target's pass
        }
      }
    });
  }

  // The planar layout of x for `band` output rows as the forward pass reads
  // it (FillInterleaved): each row `vectors` output vectors wide, plus the
  // taps' extent, in steps of the column stride.
  PlanarLayout InterleavedLayout(int64_t band, int64_t lanes) const {
    const int64_t vectors = (cols_.out + lanes - 1) / lanes;
    return PlanarLayout{channels_, 1,
                        (band - 1) * rows_.stride + (rows_.kernel - 1) * rows_.dilation + 1,
                        ((vectors - 1) * cols_.stride + (cols_.kernel - 1) * cols_.dilation + 1) *
                            lanes};
  }

  // Bands of output rows no taller than the workers' share (Band), with a
  // planar source the L2 cache can hold.
  int64_t InterleavedBand(int64_t threads, int64_t lanes) const {
    const PlanarLayout one = InterleavedLayout(1, lanes);
    const int64_t row_bytes = one.channels * one.pitch * sizeof(T);
    const int64_t rows_held = kCacheBytesPerThread / std::max<int64_t>(row_bytes, 1);
    const int64_t cap = std::max<int64_t>(1, (rows_held - one.rows) / rows_.stride + 1);
    return std::min(Band(rows_.out, threads), cap);
  }

  // The terms by filter, each filter's in order of their offsets into the
  // InterleavedLayout ([row][channel][pitch]).
  GroupedTerms<T> InterleavedTerms(const PlanarLayout& layout, int64_t lanes,
                                   const T* values) const {
    const int32_t* r = Rows();
    GroupedTerms<T> grouped = Group<T>(
        nnz_, filters_, values, [&](int64_t k) { return Cols()[k]; },
        [&](int64_t k) {
          return (TapRow(r[k]) * rows_.dilation * channels_ + Channel(r[k])) * layout.pitch +
                 TapCol(r[k]) * cols_.dilation * lanes;
        });
    grouped.SortByOffset();
    return grouped;
  }

  absl::Status Forward() {
    const ArrayView<T>& bias = in_.bias;
    if (bias.shape.size() != 1 || (bias.size() != 0 && bias.size() != filters_)) {
      return errors::InvalidArgument("bias must be empty or of length ", filters_,
                                     ", got shape [", absl::StrJoin(bias.shape, ", "), "]");
    }
    TF_ASSIGN_OR_RETURN(T* y, outputs_(0, {batch_, rows_.out, cols_.out, filters_}));
    if (batch_ == 0 || rows_.out == 0 || cols_.out == 0) return absl::OkStatus();
    if (channels_ == 0) {  // no input channels, so no nonzeros: y is the bias
      for (int64_t pixel = 0; pixel < batch_ * rows_.out * cols_.out; ++pixel) {
        for (int64_t f = 0; f < filters_; ++f) {
          y[pixel * filters_ + f] = bias.size() == 0 ? T(0) : bias.data[f];
        }
      }
      return absl::OkStatus();
    }
    const int64_t lanes = RunLanes<T>(isa_);
    const int64_t band = InterleavedBand(workers_.threads, lanes);
    const PlanarLayout layout = InterleavedLayout(band, lanes);
    TF_RETURN_IF_ERROR(CheckScratch<T>(layout, InputImage()));
    const GroupedTerms<T> terms = InterleavedTerms(layout, lanes, in_.values.data);
    const int64_t span = (cols_.out + lanes - 1) / lanes * cols_.stride;
    const Fill fill = [&](const T* image, const Placement& here, T* planar) {
      RunFillInterleaved<T>(isa_, image, rows_.in, cols_.in, here, span, layout, planar);
    };
    const Placement at{1, 1, rows_.pad_before, cols_.pad_before, 0};
    CorrelateUnits(in_.x.data, rows_.in, cols_.in, layout, fill, at, band,
                   rows_.stride * channels_ * layout.pitch,
                   OutputVectors{cols_.stride * lanes, true},
                   {{terms.View(), y, rows_.out, cols_.out}},
                   bias.size() == 0 ? nullptr : bias.data,
                   OutputStrides{OutputImage(), cols_.out * filters_, filters_});
    return absl::OkStatus();
  }

  // One axis of one stride phase of dx (the positions phase, phase +
  // stride, ...): the output position p of that phase, dx's phase + p *
  // stride, receives dy[p + e] through each tap whose dy offset e = (phase +
  // pad - tap * dilation) / stride is whole. `size` positions; the offsets
  // span [base, base + span] with base <= 0 (0 when no tap reaches it).
  struct PhaseAxis {
    int64_t phase, size, base, span;

    PhaseAxis(const Axis& a, int64_t phase_) : phase(phase_), base(0), span(0) {
      size = a.in > phase ? (a.in - phase + a.stride - 1) / a.stride : 0;
      int64_t top = 0;
      for (int64_t tap = 0; tap < a.kernel; ++tap) {
        int64_t e;
        if (!Offset(a, tap, &e)) continue;
        base = std::min(base, e);
        top = std::max(top, e);
      }
      span = top - base;
    }

    // The phases' sizes and offsets together (the largest size, the
    // offsets' whole span).
    static PhaseAxis Union(const std::vector<PhaseAxis>& phases) {
      PhaseAxis u = phases[0];
      int64_t top = u.base + u.span;
      for (const PhaseAxis& p : phases) {
        u.size = std::max(u.size, p.size);
        u.base = std::min(u.base, p.base);
        top = std::max(top, p.base + p.span);
      }
      u.span = top - u.base;
      return u;
    }

    // Whether `tap` reaches this phase, and its dy offset `e` if so.
    bool Offset(const Axis& a, int64_t tap, int64_t* e) const {
      const int64_t r = phase + a.pad_before - tap * a.dilation;
      if (r % a.stride != 0) return false;
      *e = r / a.stride;
      return true;
    }
  };

  // dx by stride phases (a single phase for stride 1): each phase is the
  // correlation of dy, as it is, with the taps that reach it, flipped
  // (PhaseAxis), written to every stride-th row and pixel of dx. Only real
  // terms are multiplied (no zeros are inserted between dy's pixels), and
  // each unit's planar copy of dy serves all the phases.
  absl::Status BackpropInput() {
    TF_ASSIGN_OR_RETURN(T* dx, outputs_(0, {batch_, rows_.in, cols_.in, channels_}));
    if (batch_ == 0 || rows_.in == 0 || cols_.in == 0 || channels_ == 0) {
      return absl::OkStatus();  // nothing to write (Band divides by the batch)
    }
    const T* values = in_.values.data;
    if (!std::all_of(values, values + nnz_, [](T v) { return v - v == T(0); })) {
      // The correlation multiplies the padding zeros by the values too:
      // exact only for finite values.
      BackpropInputDirect(values, dx);
      return absl::OkStatus();
    }
    std::vector<PhaseAxis> ph, pw;  // one source window for all: the widest
    // Phases past the input have no pixels of dx: a stride as long as the
    // input's side takes no more than it.
    for (int64_t p = 0; p < std::min(rows_.stride, rows_.in); ++p) ph.emplace_back(rows_, p);
    for (int64_t p = 0; p < std::min(cols_.stride, cols_.in); ++p) pw.emplace_back(cols_, p);
    const PhaseAxis rows_window = PhaseAxis::Union(ph), cols_window = PhaseAxis::Union(pw);
    const int64_t band = Band(rows_window.size, workers_.threads);
    const int64_t lanes = RunLanes<T>(isa_);
    const PlanarLayout layout{filters_, 1, band + rows_window.span,
                              (cols_window.size + lanes - 1) / lanes * lanes + cols_window.span};
    TF_RETURN_IF_ERROR(CheckScratch<T>(layout, OutputImage()));
    std::vector<GroupedTerms<T>> terms;
    terms.reserve(ph.size() * pw.size());  // the targets view them
    std::vector<CorrelateTarget<T>> targets;
    for (const PhaseAxis& h : ph) {
      for (const PhaseAxis& w : pw) {
        terms.push_back(PhaseTerms(values, h, w, layout, rows_window.base, cols_window.base));
        targets.push_back({terms.back().View(),
                           dx + (h.phase * cols_.in + w.phase) * channels_, h.size, w.size});
      }
    }
    const Placement at{1, 1, -rows_window.base, -cols_window.base, 0};
    const Fill fill = [&](const T* image, const Placement& here, T* planar) {
      RunFillPlanar<T>(isa_, image, rows_.out, cols_.out, here, layout, planar);
    };
    CorrelateUnits(in_.dy.data, rows_.out, cols_.out, layout, fill, at, band, layout.pitch,
                   OutputVectors{lanes, false}, targets, nullptr,
                   OutputStrides{InputImage(), rows_.stride * cols_.in * channels_,
                                 cols_.stride * channels_});
    return absl::OkStatus();
  }

  // The nonzeros that reach phase (ph, pw), grouped by input channel, at
  // their offsets in `layout`, whose row and column 0 are dy's offsets
  // row_base and col_base.
  GroupedTerms<T> PhaseTerms(const T* values, const PhaseAxis& ph, const PhaseAxis& pw,
                             const PlanarLayout& layout, int64_t row_base,
                             int64_t col_base) const {
    const int32_t* r = Rows();
    auto reaches = [&](int64_t k, int64_t* e, int64_t* f) {
      return ph.Offset(rows_, TapRow(r[k]), e) && pw.Offset(cols_, TapCol(r[k]), f);
    };
    return Group<T>(
        nnz_, channels_, values,
        [&](int64_t k) {
          int64_t e, f;
          return reaches(k, &e, &f) ? Channel(r[k]) : int64_t{-1};
        },
        [&](int64_t k) {
          int64_t e = 0, f = 0;
          reaches(k, &e, &f);
          return (Cols()[k] * layout.rows + e - row_base) * layout.pitch + f - col_base;
        });
  }

  // The input gradient term by term on channels-last tensors (slow, exact
  // for any values: used when some are not finite).
  void BackpropInputDirect(const T* values, T* dx) const {
    std::fill(dx, dx + batch_ * InputImage(), T(0));
    const T* dy = in_.dy.data;
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t k = 0; k < nnz_; ++k) {
        const int64_t r = Rows()[k], f = Cols()[k];
        for (int64_t oy = 0; oy < rows_.out; ++oy) {
          const int64_t h = oy * rows_.stride + TapRow(r) * rows_.dilation - rows_.pad_before;
          for (int64_t ox = 0; ox < cols_.out && h >= 0 && h < rows_.in; ++ox) {
            const int64_t w =
                ox * cols_.stride + TapCol(r) * cols_.dilation - cols_.pad_before;
            if (w < 0 || w >= cols_.in) continue;
            dx[((b * rows_.in + h) * cols_.in + w) * channels_ + Channel(r)] +=
                values[k] * dy[((b * rows_.out + oy) * cols_.out + ox) * filters_ + f];
          }
        }
      }
    }
  }

  // dv and the bias gradient (dy summed over its pixels, while each image's
  // planar copy of dy is in cache) over groups of images; each group keeps
  // [nnz + filters][lanes] partial sums, added up at the end.
  absl::Status BackpropValues() {
    TF_ASSIGN_OR_RETURN(T* out, outputs_(0, {nnz_}));
    TF_ASSIGN_OR_RETURN(T* bias_out, outputs_(1, {filters_}));
    std::fill(out, out + nnz_, T(0));
    std::fill(bias_out, bias_out + filters_, T(0));
    if (rows_.out == 0 || cols_.out == 0 || batch_ == 0) return absl::OkStatus();
    const int64_t lanes = RunLanes<T>(isa_);
    const PlanarLayout x_layout = ForwardLayout(rows_.out, lanes);
    const PlanarLayout dy_layout{filters_, 1, rows_.out,
                                 (cols_.out + lanes - 1) / lanes * lanes};
    const int64_t x_image = InputImage();
    const int64_t dy_image = OutputImage();
    // (dy_layout is one image of dy, padded to whole vectors.)
    if (nnz_ > 0) TF_RETURN_IF_ERROR(CheckScratch<T>(x_layout, x_image));
    const GroupedTerms<T> grouped = ForwardTerms(x_layout, nullptr);
    const ConvTerms<T> terms = grouped.View();
    const int64_t groups =
        std::max<int64_t>(1, std::min<int64_t>(batch_, 4 * workers_.threads));
    const int64_t sums = nnz_ + filters_;  // per group: the terms', then the filters'
    std::vector<T> partial(groups * sums * lanes, T(0));  // [group][sum][lane]
    const T* x = in_.x.data;
    const T* dy = in_.dy.data;
    const Placement x_at{1, 1, rows_.pad_before, cols_.pad_before, 0};
    const Placement dy_at{1, 1, 0, 0, 0};
    auto work = [&](int64_t begin, int64_t end) {
      auto x_planar = Scratch<T>(nnz_ == 0 ? 0 : x_layout.Size() + 2 * lanes);
      auto dy_planar = Scratch<T>(dy_layout.Size());
      for (int64_t group = begin; group < end; ++group) {
        T* group_sums = partial.data() + group * sums * lanes;
        for (int64_t b = group * batch_ / groups; b < (group + 1) * batch_ / groups; ++b) {
          RunFillPlanar<T>(isa_, dy + b * dy_image, rows_.out, cols_.out, dy_at, dy_layout,
                           dy_planar.get());
          RunAddPlaneSums<T>(isa_, dy_planar.get(), filters_, dy_layout.rows * dy_layout.pitch,
                             group_sums + nnz_ * lanes);
          if (nnz_ == 0) continue;
          RunFillPlanar<T>(isa_, x + b * x_image, rows_.in, cols_.in, x_at, x_layout,
                           x_planar.get());
          RunValuesGradient<T>(isa_, x_planar.get(), dy_planar.get(), terms, rows_.out,
                               cols_.out, rows_.stride * x_layout.pitch, group_sums);
        }
      }
    };
    ParallelUnits(workers_, groups, work);
    for (int64_t k = 0; k < sums; ++k) {
      T sum = 0;
      for (int64_t group = 0; group < groups; ++group) {
        for (int64_t l = 0; l < lanes; ++l) sum += partial[(group * sums + k) * lanes + l];
      }
      (k < nnz_ ? out[k] : bias_out[k - nnz_]) = sum;
    }
    return absl::OkStatus();
  }

  const Pass pass_;
  const Isa isa_;
  const int64_t filters_;
  const bool same_;
  const std::vector<std::vector<int64_t>>& pairs_;
  const ConvInputs<T>& in_;
  const ConvOutputs<T>& outputs_;
  const ConvWorkers& workers_;
  int64_t batch_ = 0, channels_ = 0, nnz_ = 0;
  Axis rows_{}, cols_{};
};

}  // namespace

absl::Status MakeConvSettings(const std::string& isa, int64_t filters,
                              const std::string& padding,
                              const std::vector<std::vector<int64_t>>& pairs,
                              ConvSettings* settings) {
  TF_RETURN_IF_ERROR(IsaFromName(isa, &settings->isa));
  if (filters < 1) return errors::InvalidArgument("filters must be >= 1, got ", filters);
  if (padding != "VALID" && padding != "SAME") {
    return errors::InvalidArgument("padding must be 'VALID' or 'SAME', got '", padding, "'");
  }
  const char* names[] = {"kernel_size", "strides", "dilations"};
  if (pairs.size() != 3) {
    return errors::InvalidArgument("expected kernel_size, strides and dilations, got ",
                                   pairs.size(), " pairs");
  }
  for (int i = 0; i < 3; ++i) {
    if (pairs[i].size() != 2 || pairs[i][0] < 1 || pairs[i][1] < 1) {
      return errors::InvalidArgument(names[i], " must be two positive ints");
    }
  }
  // Each axis's dilated extent in an int32 (as the pixels it spans), so the
  // planar layouts' sizes stay far inside int64.
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t extent = (pairs[0][axis] - 1) * pairs[2][axis] + 1;  // < 2^62
    if (extent > std::numeric_limits<int32_t>::max()) {
      return errors::InvalidArgument(
          "kernel_size and dilations: the dilated kernel, (kernel_size - 1) * dilations + 1 = ",
          extent, " pixels along axis ", axis, ", must be at most 2**31 - 1");
    }
  }
  settings->filters = filters;
  settings->same = padding == "SAME";
  settings->pairs = pairs;
  return absl::OkStatus();
}

absl::Status ConvSettingsFromAttrs(OpKernelConstruction* ctx, ConvSettings* settings) {
  std::string isa, padding;
  int64_t filters;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &isa));
  TF_RETURN_IF_ERROR(ctx->GetAttr("filters", &filters));
  TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
  std::vector<std::vector<int64_t>> pairs;
  for (const char* name : {"kernel_size", "strides", "dilations"}) {
    std::vector<int32> pair;
    TF_RETURN_IF_ERROR(ctx->GetAttr(name, &pair));
    pairs.emplace_back(pair.begin(), pair.end());
  }
  return MakeConvSettings(isa, filters, padding, pairs, settings);
}

absl::Status CheckInputShape(const std::vector<int64_t>& input_shape) {
  bool valid = input_shape.size() == 4;
  int64_t elements = 1;
  for (const int64_t size : input_shape) {
    valid = valid && size >= 0 && !__builtin_mul_overflow(elements, size, &elements);
  }
  if (valid) return absl::OkStatus();
  return errors::InvalidArgument(
      "input_shape must be 4 sizes >= 0 whose product fits int64, got [",
      absl::StrJoin(input_shape, ", "), "]");
}

std::vector<int64_t> ForwardOutputShape(const ConvSettings& settings,
                                        const std::vector<int64_t>& x_shape) {
  const auto& k = settings.pairs;
  const Axis rows = MakeAxis(x_shape[1], k[0][0], k[1][0], k[2][0], settings.same);
  const Axis cols = MakeAxis(x_shape[2], k[0][1], k[1][1], k[2][1], settings.same);
  return {x_shape[0], rows.out, cols.out, settings.filters};
}

template <typename T>
absl::Status RunConv(const ConvSettings& settings, Pass pass, const ConvInputs<T>& inputs,
                     const ConvOutputs<T>& outputs, const ConvWorkers& workers) {
  return ConvCall<T>(settings, pass, inputs, outputs, workers).Run();
}

template absl::Status RunConv<float>(const ConvSettings&, Pass, const ConvInputs<float>&,
                                     const ConvOutputs<float>&, const ConvWorkers&);
template absl::Status RunConv<double>(const ConvSettings&, Pass, const ConvInputs<double>&,
                                      const ConvOutputs<double>&, const ConvWorkers&);

}  // namespace conv
}  // namespace tfsparse

namespace {

using tfsparse::conv::ArrayView;
using tfsparse::conv::ConvInputs;
using tfsparse::conv::ConvSettings;
using tfsparse::conv::Pass;

#define TFSPARSE_CONV_ATTRS                     \
  Attr("T: {float, double}")                    \
      .Attr("filters: int >= 1")                \
      .Attr("kernel_size: list(int) >= 2")      \
      .Attr("strides: list(int) >= 2")          \
      .Attr("dilations: list(int) >= 2")        \
      .Attr("padding: {'VALID', 'SAME'}")       \
      .Attr("isa: string = ''")

REGISTER_OP("TfsparseSparseConvForward")
    .Input("x: T")
    .Input("values: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Input("bias: T")
    .Output("y: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &x));
      int64_t filters;
      TF_RETURN_IF_ERROR(c->GetAttr("filters", &filters));
      c->set_output(0, c->MakeShape({c->Dim(x, 0), c->UnknownDim(), c->UnknownDim(),
                                     c->MakeDim(filters)}));
      return absl::OkStatus();
    });

REGISTER_OP("TfsparseSparseConvBackpropInput")
    .Input("dy: T")
    .Input("values: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Input("input_shape: int32")
    .Output("dx: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn(shape_inference::UnknownShape);

REGISTER_OP("TfsparseSparseConvBackpropValues")
    .Input("x: T")
    .Input("dy: T")
    .Input("rows: int32")
    .Input("cols: int32")
    .Output("dv: T")
    .Output("dbias: T")
    .TFSPARSE_CONV_ATTRS
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(2));
      int64_t filters;
      TF_RETURN_IF_ERROR(c->GetAttr("filters", &filters));
      c->set_output(1, c->MakeShape({c->MakeDim(filters)}));
      return absl::OkStatus();
    });

template <typename T>
ArrayView<T> ViewOf(const Tensor& t) {
  ArrayView<T> view{t.flat<T>().data(), {}};
  for (int d = 0; d < t.dims(); ++d) view.shape.push_back(t.dim_size(d));
  return view;
}

// One of the three ops on TensorFlow's CPU device: its inputs as the pass
// reads them (sparse_conv.h), outputs allocated by TensorFlow, work on the
// device's intra-op pool.
template <typename T>
class SparseConvOp : public OpKernel {
 public:
  explicit SparseConvOp(OpKernelConstruction* ctx, Pass pass) : OpKernel(ctx), pass_(pass) {
    OP_REQUIRES_OK(ctx, tfsparse::conv::ConvSettingsFromAttrs(ctx, &settings_));
  }

  void Compute(OpKernelContext* ctx) override {
    ConvInputs<T> in;
    in.rows = ViewOf<int32_t>(ctx->input(2));
    in.cols = ViewOf<int32_t>(ctx->input(3));
    if (pass_ == Pass::kForward) {
      in.x = ViewOf<T>(ctx->input(0));
      in.values = ViewOf<T>(ctx->input(1));
      in.bias = ViewOf<T>(ctx->input(4));
    } else if (pass_ == Pass::kBackpropInput) {
      in.dy = ViewOf<T>(ctx->input(0));
      in.values = ViewOf<T>(ctx->input(1));
      const Tensor& shape = ctx->input(4);
      OP_REQUIRES(ctx, shape.dims() == 1,
                  errors::InvalidArgument("input_shape must be a vector of 4 sizes"));
      for (int d = 0; d < shape.NumElements(); ++d) {
        in.input_shape.push_back(shape.flat<int32>()(d));
      }
    } else {
      in.x = ViewOf<T>(ctx->input(0));
      in.dy = ViewOf<T>(ctx->input(1));
    }
    const tfsparse::conv::ConvOutputs<T> outputs =
        [ctx](int index, const std::vector<int64_t>& shape) -> absl::StatusOr<T*> {
      Tensor* out = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape(shape), &out));
      return out->flat<T>().data();
    };
    const auto& threads = *ctx->device()->tensorflow_cpu_worker_threads();
    const tfsparse::conv::ConvWorkers workers{
        threads.num_threads,
        [&threads](int64_t units, int64_t block, const std::function<void(int64_t, int64_t)>& fn) {
          threads.workers->ParallelFor(units, thread::ThreadPool::SchedulingParams::Fixed(block),
                                       fn);
        }};
    OP_REQUIRES_OK(ctx, tfsparse::conv::RunConv<T>(settings_, pass_, in, outputs, workers));
  }

 private:
  Pass pass_;
  ConvSettings settings_;
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
