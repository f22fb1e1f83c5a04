// The size of a core's L2 cache, which some kernels' blocking depends on.
//
// Only a kernel's speed may depend on it, never its results: a choice made
// from it (the SpMM's panel rows, spmm_variant.inc) must give the same sums
// in the same order either way.
#ifndef TFSPARSE_OPS_KERNELS_CACHE_SIZE_H_
#define TFSPARSE_OPS_KERNELS_CACHE_SIZE_H_

#include <cstdint>

namespace tfsparse {

// Bytes of L2 per core as the OS reports it (sysconf, else sysfs), read
// once; kAssumedL2Bytes when neither tells.
int64_t L2CacheBytes();

// What L2CacheBytes assumes when the OS does not tell: 2 MiB, the L2 of the
// CPUs the kernels' blocking was first measured on.
constexpr int64_t kAssumedL2Bytes = int64_t{1} << 21;

}  // namespace tfsparse

#endif  // TFSPARSE_OPS_KERNELS_CACHE_SIZE_H_
