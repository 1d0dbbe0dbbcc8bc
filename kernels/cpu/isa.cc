#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <string>

namespace bitroll::kernels {
namespace {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;
};

uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Probe() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = (c >> 12) & 1;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  const bool f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1;
  const bool avx512f = (b >> 16) & 1;
  const bool avx512dq = (b >> 17) & 1;
  const bool avx512bw = (b >> 30) & 1;
  const bool avx512vl = (b >> 31) & 1;
  f.avx2 = os_ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  return f;
}

const CpuFeatures& Features() {
  static const CpuFeatures features = Probe();
  return features;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return Features().avx2;
    case Isa::kAvx512:
      return Features().avx512;
  }
  return false;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Result<Isa> ParseIsa(std::string_view name) {
  Isa isa;
  if (name == "auto") return BestIsa();
  if (name == "scalar") {
    isa = Isa::kScalar;
  } else if (name == "avx2") {
    isa = Isa::kAvx2;
  } else if (name == "avx512") {
    isa = Isa::kAvx512;
  } else {
    return Status::InvalidArgument("unknown ISA '" + std::string(name) +
                                   "' (expected scalar, avx2, avx512 or auto)");
  }
  if (!IsaSupported(isa)) {
    return Status::Unsupported("this CPU cannot run the " + std::string(IsaName(isa)) + " path");
  }
  return isa;
}

}  // namespace bitroll::kernels
