// Instruction-set variants of tfsparse's kernels, chosen at run time.
//
// The library is compiled once for generic x86-64 (or any other target);
// each kernel's compute code is compiled three times into its own namespace
// (variants.inc): `portable` with the build's baseline flags, `avx2` for
// AVX2 + FMA, `avx512` for AVX-512 F/DQ/BW/VL. Which one runs is an attribute
// of each op ("isa"), set by the Python side from what the CPU reports
// (CPUID, with the OS's support of the wider registers checked) or from
// TFSPARSE_ISA; an op asked for a variant the CPU lacks fails with an error
// instead of executing an illegal instruction.
#ifndef TFSPARSE_OPS_KERNELS_ISA_H_
#define TFSPARSE_OPS_KERNELS_ISA_H_

#include <string>

#include "tensorflow/core/framework/op_kernel.h"

namespace tfsparse {

enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// Bit (1 << Isa) is set for every variant this CPU can run; kPortable always.
int SupportedIsaMask();

inline bool IsaSupported(Isa isa) {
  return (SupportedIsaMask() >> static_cast<int>(isa)) & 1;
}

// The widest variant the CPU supports.
Isa BestIsa();

// The variant named "" (BestIsa()), "portable", "avx2" or "avx512", which
// the CPU must support.
absl::Status IsaFromName(const std::string& name, Isa* isa);

// Reads the op's "isa" attribute (IsaFromName).
absl::Status IsaFromAttr(tensorflow::OpKernelConstruction* ctx, Isa* isa);

}  // namespace tfsparse

// Runs `FN(args...)` from the namespace of the variant `isa`, as `return`:
//   TFSPARSE_DISPATCH(isa_, Spmm<T>, ctx, x, ...);
#if defined(__x86_64__) || defined(_M_X64)
#define TFSPARSE_DISPATCH(ISA, FN, ...)                        \
  switch (ISA) {                                               \
    case ::tfsparse::Isa::kAvx512:                             \
      return ::tfsparse::isa_avx512::FN(__VA_ARGS__);          \
    case ::tfsparse::Isa::kAvx2:                               \
      return ::tfsparse::isa_avx2::FN(__VA_ARGS__);            \
    default:                                                   \
      return ::tfsparse::isa_portable::FN(__VA_ARGS__);        \
  }
#else
#define TFSPARSE_DISPATCH(ISA, FN, ...) \
  return ::tfsparse::isa_portable::FN(__VA_ARGS__);
#endif

#endif  // TFSPARSE_OPS_KERNELS_ISA_H_
