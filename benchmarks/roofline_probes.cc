// Roofline probes: peak multiply-add throughput and load bandwidth of this
// CPU, for one instruction-set variant of tfsparse's kernels.
//
// benchmarks/roofline.py compiles this file once per variant with
// -DVEC_FLOATS=4 (SSE2, the portable baseline), 8 (-mavx2 -mfma) or 16
// (-mavx512f -mfma), loads it with ctypes and calls the two probes below.
// GCC vector extensions keep one source for every width; with -mfma the
// compiler contracts `a * b + c` into one fused multiply-add (checked by the
// probe's figure: it doubles when FMA is on).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#ifndef VEC_FLOATS
#error "compile with -DVEC_FLOATS=4, 8 or 16"
#endif

typedef float Vec __attribute__((vector_size(VEC_FLOATS * 4)));

namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs fn(thread) on `threads` threads at once; the wall time of the slowest.
template <typename Fn>
double Parallel(int threads, Fn fn) {
  const double start = Now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(fn, t);
  fn(0);
  for (auto& thread : pool) thread.join();
  return Now() - start;
}

// 12 independent chains (named, so they stay in registers): enough to cover
// an FMA latency of 4-6 cycles on 2 ports. Returns a sum the caller keeps, so
// nothing is optimised away.
float FmaChains(int64_t iterations, float seed) {
  const Vec a = Vec{} + 0.999999f, b = Vec{} + 1e-7f;
  Vec c0 = Vec{} + seed, c1 = c0 + 1, c2 = c0 + 2, c3 = c0 + 3, c4 = c0 + 4,
      c5 = c0 + 5, c6 = c0 + 6, c7 = c0 + 7, c8 = c0 + 8, c9 = c0 + 9,
      c10 = c0 + 10, c11 = c0 + 11;
  for (int64_t it = 0; it < iterations; ++it) {
    c0 = c0 * a + b, c1 = c1 * a + b, c2 = c2 * a + b, c3 = c3 * a + b;
    c4 = c4 * a + b, c5 = c5 * a + b, c6 = c6 * a + b, c7 = c7 * a + b;
    c8 = c8 * a + b, c9 = c9 * a + b, c10 = c10 * a + b, c11 = c11 * a + b;
  }
  const Vec sum = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11;
  return sum[0];
}

// Sums `bytes` of `buffer` `passes` times with 8 independent vector loads in
// flight per iteration (every load hits the buffer's next vector).
float LoadPasses(const float* buffer, int64_t bytes, int64_t passes) {
  const Vec* v = reinterpret_cast<const Vec*>(buffer);
  const int64_t vectors = bytes / sizeof(Vec);
  Vec a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};
  for (int64_t pass = 0; pass < passes; ++pass) {
    for (int64_t i = 0; i + 8 <= vectors; i += 8) {
      a0 += v[i], a1 += v[i + 1], a2 += v[i + 2], a3 += v[i + 3];
      a4 += v[i + 4], a5 += v[i + 5], a6 += v[i + 6], a7 += v[i + 7];
    }
  }
  const Vec sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
  return sum[0];
}

volatile float sink;

}  // namespace

extern "C" {

int roofline_vector_floats() { return VEC_FLOATS; }

// Multiply-adds per second (each lane of each vector op counts one) on
// `threads` threads, each running `iterations` x 12 vector multiply-adds.
double roofline_madds_per_second(int threads, int64_t iterations) {
  const double seconds = Parallel(threads, [&](int t) {
    sink = FmaChains(iterations, static_cast<float>(t));
  });
  return threads * static_cast<double>(iterations) * 12 * VEC_FLOATS / seconds;
}

// Load bandwidth in bytes per second: each of `threads` threads sums its own
// 64-byte aligned buffer of `bytes` bytes `passes` times (one warm-up pass
// first, so the buffer sits in the level of the hierarchy its size selects).
double roofline_load_bytes_per_second(int threads, int64_t bytes,
                                      int64_t passes) {
  std::vector<float*> buffers(threads);
  for (auto& buffer : buffers) {
    buffer = static_cast<float*>(std::aligned_alloc(64, bytes));
    for (int64_t i = 0; i < bytes / 4; ++i) buffer[i] = 1e-3f * (i & 255);
  }
  Parallel(threads, [&](int t) { sink = LoadPasses(buffers[t], bytes, 1); });
  const double seconds = Parallel(threads, [&](int t) {
    sink = LoadPasses(buffers[t], bytes, passes);
  });
  for (auto* buffer : buffers) std::free(buffer);
  return threads * static_cast<double>(bytes) * passes / seconds;
}

}  // extern "C"
