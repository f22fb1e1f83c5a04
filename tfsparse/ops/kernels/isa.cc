// CPU feature detection for the kernel variants (isa.h).
#include "isa.h"

namespace tfsparse {

int SupportedIsaMask() {
  static const int mask = [] {
    int m = 1 << static_cast<int>(Isa::kPortable);
#if (defined(__x86_64__) || defined(_M_X64)) && defined(__GNUC__)
    // GCC's and Clang's runtimes read CPUID and report AVX and AVX-512 only
    // when the OS saves their registers (XGETBV), so a CPU whose kernel or
    // hypervisor disabled them gets the narrower variant.
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") &&
                      __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("popcnt") &&
                      __builtin_cpu_supports("bmi") &&
                      __builtin_cpu_supports("bmi2");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl");
    if (avx2) m |= 1 << static_cast<int>(Isa::kAvx2);
    if (avx512) m |= 1 << static_cast<int>(Isa::kAvx512);
#endif
    return m;
  }();
  return mask;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kPortable;
}

absl::Status IsaFromName(const std::string& name, Isa* isa) {
  if (name.empty()) {
    *isa = BestIsa();
    return absl::OkStatus();
  }
  if (name == "portable") {
    *isa = Isa::kPortable;
  } else if (name == "avx2") {
    *isa = Isa::kAvx2;
  } else if (name == "avx512") {
    *isa = Isa::kAvx512;
  } else {
    return tensorflow::errors::InvalidArgument(
        "isa must be '', 'portable', 'avx2' or 'avx512', got '", name, "'");
  }
  if (!IsaSupported(*isa)) {
    return tensorflow::errors::InvalidArgument(
        "this CPU does not support the '", name,
        "' variant of tfsparse's kernels");
  }
  return absl::OkStatus();
}

absl::Status IsaFromAttr(tensorflow::OpKernelConstruction* ctx, Isa* isa) {
  std::string name;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &name));
  return IsaFromName(name, isa);
}

}  // namespace tfsparse

// For tfsparse.ops.kernels (ctypes): the mask of SupportedIsaMask().
extern "C" __attribute__((visibility("default"))) int
tfsparse_supported_isas() {
  return tfsparse::SupportedIsaMask();
}
