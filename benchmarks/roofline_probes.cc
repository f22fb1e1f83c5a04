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
#include <random>
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

// Reads `count` chunks of kVectors vectors of `buffer` at the chunk
// offsets `chunks` (int32, streamed, as a kernel streams its nonzeros'
// indices), into 8 independent chains: 8 / kVectors chunks a step for
// chunks of 1, 2 or 4 vectors, 8 vectors a step of a chunk of a multiple
// of 8 (kVectors = 0: `vectors` of them, a multiple of 8).
template <int64_t kVectors>
float GatherPasses(const float* buffer, const int32_t* chunks, int64_t count,
                   int64_t vectors = kVectors) {
  const Vec* v = reinterpret_cast<const Vec*>(buffer);
  Vec acc[8] = {};
  if constexpr (kVectors == 1 || kVectors == 2 || kVectors == 4) {
    constexpr int64_t kStep = 8 / kVectors;
    for (int64_t k = 0; k + kStep <= count; k += kStep) {
      for (int64_t c = 0; c < kStep; ++c) {
        const Vec* chunk = v + int64_t{chunks[k + c]} * kVectors;
        for (int64_t q = 0; q < kVectors; ++q) acc[c * kVectors + q] += chunk[q];
      }
    }
  } else {
    for (int64_t k = 0; k < count; ++k) {
      const Vec* chunk = v + int64_t{chunks[k]} * vectors;
      for (int64_t q = 0; q + 8 <= vectors; q += 8) {
        for (int u = 0; u < 8; ++u) acc[u] += chunk[q + u];
      }
    }
  }
  Vec sum = {};
  for (const Vec& a : acc) sum += a;
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

// Gather bandwidth in bytes per second: each of `threads` threads reads
// `count` (a multiple of 8) chunks of `chunk_bytes` bytes (1, 2 or 4
// vectors, or a multiple of 8; aligned to their size; -1 for other sizes)
// at random offsets (uniform, seeded) over its own buffer of `bytes` bytes,
// the offsets streamed from an int32 array: the access of a kernel that
// reads a row of a transposed panel or slice per nonzero. Unlike
// roofline_load_bytes_per_second's streams, no hardware prefetcher can
// fetch the next chunk ahead.
double roofline_gather_bytes_per_second(int threads, int64_t bytes,
                                        int64_t chunk_bytes, int64_t count) {
  const int64_t chunk_vectors = chunk_bytes / sizeof(Vec);
  if (chunk_bytes % sizeof(Vec) != 0 ||
      !(chunk_vectors == 1 || chunk_vectors == 2 || chunk_vectors == 4 ||
        (chunk_vectors > 0 && chunk_vectors % 8 == 0)) ||
      bytes < chunk_bytes || count % 8 != 0) {
    return -1;
  }
  const int64_t chunks_in_buffer = bytes / chunk_bytes;
  std::vector<float*> buffers(threads);
  std::vector<std::vector<int32_t>> offsets(threads);
  for (int t = 0; t < threads; ++t) {
    // aligned_alloc takes a multiple of the alignment.
    buffers[t] = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    for (int64_t i = 0; i < bytes / 4; ++i) buffers[t][i] = 1e-3f * (i & 255);
    std::mt19937 random(t + 1);
    offsets[t].resize(count);
    for (auto& offset : offsets[t]) {
      offset = static_cast<int32_t>(random() % chunks_in_buffer);
    }
  }
  auto run = [&](int t) {
    const int32_t* chunks = offsets[t].data();
    switch (chunk_vectors) {
      case 1: sink = GatherPasses<1>(buffers[t], chunks, count); break;
      case 2: sink = GatherPasses<2>(buffers[t], chunks, count); break;
      case 4: sink = GatherPasses<4>(buffers[t], chunks, count); break;
      default: sink = GatherPasses<0>(buffers[t], chunks, count, chunk_vectors);
    }
  };
  Parallel(threads, run);  // warm-up: the buffer into its level
  const double seconds = Parallel(threads, run);
  for (auto* buffer : buffers) std::free(buffer);
  return threads * static_cast<double>(count) * chunk_bytes / seconds;
}

}  // extern "C"
