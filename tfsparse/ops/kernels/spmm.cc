// TfsparseSpmm: a dense matrix times a sparse one, in segment (CSC) form.
//
//   y[b, j] = bias[j] + sum_{k : seg[k] == j} x[b, idx[k]] * values[k]
//
// The nonzeros are sorted by their output index `seg`; the segment pointers
// are built here in one pass (no separate op per call). `bias` may be empty
// (no bias); adding it here saves the pass over the output that
// tf.nn.bias_add would make, as Grappler's fused MatMul + BiasAdd does for
// Dense. With the kernel's column-major pattern (idx = input of each nonzero,
// seg = its column) this is the forward product x @ W; with the row-major
// pattern (idx = output, seg = row) it is the input gradient dy @ W^T.
//
// The batch is processed in panels of P rows: a panel of x is copied
// transposed ([n_in][P], contiguous per input, 64-byte aligned), so each
// nonzero costs one vector load and multiply-add for P batch rows at once.
// Work units are (panel, range of output columns) pairs on TF's intra-op pool.
//
// Two instances: with AVX-512 (the build uses -march=native), float batches of
// 16 rows or more use P = 16, one zmm register per nonzero, with the panel
// filled and the results written by 16x16 in-register transposes; the time is
// then bound by reading the panel's columns from L2. Everything else (double,
// small batches, CPUs without AVX-512) uses the portable P = 8 loop.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

using namespace tensorflow;  // NOLINT

REGISTER_OP("TfsparseSpmm")
    .Input("x: T")
    .Input("values: T")
    .Input("idx: int32")
    .Input("seg: int32")
    .Input("bias: T")
    .Output("y: T")
    .Attr("T: {float, double}")
    .Attr("units: int >= 0")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      int64_t units;
      TF_RETURN_IF_ERROR(c->GetAttr("units", &units));
      c->set_output(0, c->Matrix(c->Dim(x, 0), units));
      return absl::OkStatus();
    });

namespace {

constexpr int64_t kTile = 16;

// A 64-byte aligned scratch buffer: a panel column of 16 floats is then one
// cache line, and no vector load straddles two lines.
template <typename T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(int64_t size)
      : data_(static_cast<T*>(std::aligned_alloc(
            64, std::max<int64_t>(64, (size * sizeof(T) + 63) / 64 * 64)))) {}
  T* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
};

// Runs `compute_panel(panel_buffer, p, b0, rows, j_begin, j_end)` for every
// (panel, column range) unit on TF's intra-op pool; fills the panel first.
template <typename T, int64_t kPanel, typename Fill, typename Compute>
void ForEachPanel(OpKernelContext* ctx, int64_t batch, int64_t n_in,
                  int64_t units, int64_t nnz, Fill fill, Compute compute) {
  const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t panels = (batch + kPanel - 1) / kPanel;
  // Enough work units for every thread, split over columns when the batch
  // has few panels.
  const int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>(units, (4 * workers.num_threads + panels - 1) /
                                      panels));
  const int64_t chunk_units = (units + chunks - 1) / chunks;
  auto work = [&](int64_t begin, int64_t end) {
    AlignedBuffer<T> panel(n_in * kPanel);
    int64_t panel_in_buffer = -1;
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t p = unit / chunks;
      const int64_t b0 = p * kPanel;
      const int64_t rows = std::min(kPanel, batch - b0);
      if (p != panel_in_buffer) {
        fill(panel.get(), b0, rows);
        panel_in_buffer = p;
      }
      const int64_t j_begin = (unit % chunks) * chunk_units;
      const int64_t j_end = std::min(units, j_begin + chunk_units);
      compute(panel.get(), b0, rows, j_begin, j_end);
    }
  };
  const int64_t nnz_per_unit =
      std::max<int64_t>(1, nnz / units) * chunk_units;
  Shard(workers.num_threads, workers.workers, panels * chunks,
        /*cost_per_unit=*/kPanel * (2 * nnz_per_unit + n_in / chunks + 1),
        work);
}

// panel[i * kPanel + r] = x[b0 + r, i], zero in rows past the batch.
template <typename T, int64_t kPanel>
void FillPanel(const T* x, int64_t n_in, int64_t b0, int64_t rows, T* panel,
               int64_t first_input = 0) {
  if (rows < kPanel) std::fill(panel, panel + n_in * kPanel, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = x + (b0 + r) * n_in;
    for (int64_t i = first_input; i < n_in; ++i) panel[i * kPanel + r] = src[i];
  }
}

template <typename T, int64_t kPanel>
void SpmmPortable(OpKernelContext* ctx, const T* x, const T* values,
                  const int32_t* idx, const int64_t* ptr, const T* bias,
                  int64_t batch, int64_t n_in, int64_t units, int64_t nnz,
                  T* y) {
  auto fill = [&](T* panel, int64_t b0, int64_t rows) {
    FillPanel<T, kPanel>(x, n_in, b0, rows, panel);
  };
  auto compute = [&](const T* panel, int64_t b0, int64_t rows,
                     int64_t j_begin, int64_t j_end) {
    // Results of kTile consecutive columns are gathered in `tile` and then
    // written row by row, one cache line each: storing them column by column
    // would touch P rows units*sizeof(T) bytes apart, which alias to the same
    // cache set.
    for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
      const int64_t width = std::min(kTile, j_end - j0);
      T tile[kTile][kPanel];
      for (int64_t t = 0; t < width; ++t) {
        const int64_t j = j0 + t;
        T acc[kPanel];
        std::fill(acc, acc + kPanel, bias == nullptr ? T(0) : bias[j]);
        for (int64_t k = ptr[j]; k < ptr[j + 1]; ++k) {
          const T v = values[k];
          const T* column = panel + int64_t{idx[k]} * kPanel;
#pragma omp simd
          for (int64_t r = 0; r < kPanel; ++r) acc[r] += v * column[r];
        }
        for (int64_t r = 0; r < kPanel; ++r) tile[t][r] = acc[r];
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* out = y + (b0 + r) * units + j0;
        for (int64_t t = 0; t < width; ++t) out[t] = tile[t][r];
      }
    }
  };
  ForEachPanel<T, kPanel>(ctx, batch, n_in, units, nnz, fill, compute);
}

#if defined(__AVX512F__)
// dst[c * 16 + r] = src[r * stride + c] for r, c < 16; dst 64-byte aligned.
inline void Transpose16x16(const float* src, int64_t stride, float* dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * stride);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]);
    const __m512d t3 = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_store_ps(dst + i * 16, r[i]);
}

void SpmmAvx512(OpKernelContext* ctx, const float* x, const float* values,
                const int32_t* idx, const int64_t* ptr, const float* bias,
                int64_t batch, int64_t n_in, int64_t units, int64_t nnz,
                float* y) {
  constexpr int64_t kPanel = 16;
  auto fill = [&](float* panel, int64_t b0, int64_t rows) {
    int64_t done = 0;
    if (rows == kPanel) {
      for (; done + 16 <= n_in; done += 16) {
        Transpose16x16(x + b0 * n_in + done, n_in, panel + done * kPanel);
      }
    }
    FillPanel<float, kPanel>(x, n_in, b0, rows, panel, done);
  };
  auto column = [&](const float* panel, int64_t j) {
    // Two accumulators halve the chain of dependent multiply-adds.
    __m512 a0 = bias == nullptr ? _mm512_setzero_ps() : _mm512_set1_ps(bias[j]);
    __m512 a1 = _mm512_setzero_ps();
    int64_t k = ptr[j];
    const int64_t end = ptr[j + 1];
    for (; k + 2 <= end; k += 2) {
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(values[k]),
                           _mm512_load_ps(panel + int64_t{idx[k]} * kPanel), a0);
      a1 = _mm512_fmadd_ps(
          _mm512_set1_ps(values[k + 1]),
          _mm512_load_ps(panel + int64_t{idx[k + 1]} * kPanel), a1);
    }
    if (k < end) {
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(values[k]),
                           _mm512_load_ps(panel + int64_t{idx[k]} * kPanel), a0);
    }
    return _mm512_add_ps(a0, a1);
  };
  auto compute = [&](const float* panel, int64_t b0, int64_t rows,
                     int64_t j_begin, int64_t j_end) {
    alignas(64) float tile[kTile * kPanel];
    alignas(64) float rows_of_tile[kPanel * kTile];
    for (int64_t j0 = j_begin; j0 < j_end; j0 += kTile) {
      const int64_t width = std::min(kTile, j_end - j0);
      for (int64_t t = 0; t < width; ++t) {
        _mm512_store_ps(tile + t * kPanel, column(panel, j0 + t));
      }
      if (width == kTile && rows == kPanel) {
        Transpose16x16(tile, kPanel, rows_of_tile);
        for (int64_t r = 0; r < kPanel; ++r) {
          _mm512_storeu_ps(y + (b0 + r) * units + j0,
                           _mm512_load_ps(rows_of_tile + r * kTile));
        }
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          float* out = y + (b0 + r) * units + j0;
          for (int64_t t = 0; t < width; ++t) out[t] = tile[t * kPanel + r];
        }
      }
    }
  };
  ForEachPanel<float, kPanel>(ctx, batch, n_in, units, nnz, fill, compute);
}
#endif  // __AVX512F__

template <typename T>
void Spmm(OpKernelContext* ctx, const T* x, const T* values, const int32_t* idx,
          const int64_t* ptr, const T* bias, int64_t batch, int64_t n_in,
          int64_t units, int64_t nnz, T* y) {
  SpmmPortable<T, 8>(ctx, x, values, idx, ptr, bias, batch, n_in, units, nnz,
                     y);
}

#if defined(__AVX512F__)
template <>
void Spmm<float>(OpKernelContext* ctx, const float* x, const float* values,
                 const int32_t* idx, const int64_t* ptr, const float* bias,
                 int64_t batch, int64_t n_in, int64_t units, int64_t nnz,
                 float* y) {
  if (batch >= 16) {
    SpmmAvx512(ctx, x, values, idx, ptr, bias, batch, n_in, units, nnz, y);
  } else {
    SpmmPortable<float, 8>(ctx, x, values, idx, ptr, bias, batch, n_in, units,
                           nnz, y);
  }
}
#endif

// ptr[j] = the first k with seg[k] >= j, for j in [0, units]; false unless
// seg is sorted with entries in [0, units). One pass that compares
// neighbours 16 at a time and stops only at the column boundaries (about one
// per column), instead of a data-dependent branch per nonzero.
bool SegmentPointers(const int32_t* seg, int64_t nnz, int64_t units,
                     int64_t* ptr) {
  if (nnz == 0) {
    std::fill(ptr, ptr + units + 1, 0);
    return true;
  }
  if (seg[0] < 0 || seg[nnz - 1] >= units) return false;
  std::fill(ptr, ptr + seg[0] + 1, 0);
  // A boundary between k - 1 and k: columns seg[k - 1] + 1 .. seg[k] start at
  // k. Boundaries are only taken while seg is sorted so far, so the writes
  // cover each column at most once; the clamp keeps an entry past `units` in
  // the middle (rejected by the final check) inside ptr.
  auto boundary = [&](int64_t k) {
    const int64_t last = std::min<int64_t>(seg[k], units);
    for (int64_t j = int64_t{seg[k - 1]} + 1; j <= last; ++j) ptr[j] = k;
  };
  int64_t k = 1;
#if defined(__AVX512F__)
  for (; k + 16 <= nnz; k += 16) {
    const __m512i before = _mm512_loadu_si512(seg + k - 1);
    const __m512i after = _mm512_loadu_si512(seg + k);
    if (_mm512_cmpgt_epi32_mask(before, after) != 0) return false;
    for (uint32_t m = _mm512_cmpneq_epi32_mask(before, after); m != 0;
         m &= m - 1) {
      boundary(k + __builtin_ctz(m));
    }
  }
#endif
  for (; k < nnz; ++k) {
    if (seg[k - 1] > seg[k]) return false;
    if (seg[k - 1] < seg[k]) boundary(k);
  }
  std::fill(ptr + seg[nnz - 1] + 1, ptr + units + 1, nnz);
  return true;
}

template <typename T>
class SpmmOp : public OpKernel {
 public:
  explicit SpmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("units", &units_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_tensor = ctx->input(0);
    const Tensor& values_tensor = ctx->input(1);
    const Tensor& idx_tensor = ctx->input(2);
    const Tensor& seg_tensor = ctx->input(3);
    const Tensor& bias_tensor = ctx->input(4);
    OP_REQUIRES(ctx, x_tensor.dims() == 2,
                errors::InvalidArgument("x must be 2-D, got rank ",
                                        x_tensor.dims()));
    const int64_t batch = x_tensor.dim_size(0);
    const int64_t n_in = x_tensor.dim_size(1);
    const int64_t units = units_;
    const int64_t nnz = idx_tensor.NumElements();
    OP_REQUIRES(ctx, values_tensor.NumElements() == nnz &&
                         seg_tensor.NumElements() == nnz,
                errors::InvalidArgument(
                    "values, idx and seg differ in length: ",
                    values_tensor.NumElements(), ", ", nnz, " and ",
                    seg_tensor.NumElements()));
    OP_REQUIRES(ctx, bias_tensor.dims() == 1 &&
                         (bias_tensor.dim_size(0) == 0 ||
                          bias_tensor.dim_size(0) == units),
                errors::InvalidArgument("bias must be empty or of length ",
                                        units, ", got shape ",
                                        bias_tensor.shape().DebugString()));
    const int32_t* idx = idx_tensor.flat<int32_t>().data();
    const int32_t* seg = seg_tensor.flat<int32_t>().data();
    std::vector<int64_t> ptr(units + 1);
    OP_REQUIRES(ctx, SegmentPointers(seg, nnz, units, ptr.data()),
                errors::InvalidArgument("seg must be sorted and in [0, units=",
                                        units, ")"));
    // Branch-free check (it vectorises); the loop that names the culprit
    // runs only when it fails.
    bool idx_ok = true;
    for (int64_t k = 0; k < nnz; ++k) {
      idx_ok &= static_cast<uint32_t>(idx[k]) < static_cast<uint64_t>(n_in);
    }
    if (!idx_ok) {
      for (int64_t k = 0; k < nnz; ++k) {
        OP_REQUIRES(ctx, idx[k] >= 0 && idx[k] < n_in,
                    errors::InvalidArgument("idx[", k, "]=", idx[k],
                                            " is outside [0, ", n_in, ")"));
      }
    }
    Tensor* y_tensor = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({batch, units}), &y_tensor));
    if (batch == 0 || units == 0) return;
    const T* bias =
        bias_tensor.NumElements() == 0 ? nullptr : bias_tensor.flat<T>().data();
    Spmm<T>(ctx, x_tensor.flat<T>().data(), values_tensor.flat<T>().data(),
            idx, ptr.data(), bias, batch, n_in, units, nnz,
            y_tensor->flat<T>().data());
  }

 private:
  int64_t units_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<float>("T"),
    SpmmOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("TfsparseSpmm").Device(DEVICE_CPU).TypeConstraint<double>("T"),
    SpmmOp<double>);
