// Run-time instruction-set selection for the CPU kernels.
//
// The base build is generic x86-64. The AVX2 and AVX-512 paths live in their own source files
// (compiled with bitroll_isa_sources) and are only entered when IsaSupported() says so. Every
// kernel produces identical bits on every Isa, so the choice is a speed choice, never a numerical
// one; it is not part of the numerics fingerprint.
//
// Thread-safety: all functions are thread-safe (CPUID is probed once, on first use).
#pragma once

#include <cstdint>
#include <string_view>

#include "schema/status.h"

namespace bitroll::kernels {

enum class Isa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar" | "avx2" | "avx512". Never returns nullptr ("unknown" for an out-of-range value).
const char* IsaName(Isa isa);

// True when this CPU and OS can run `isa`'s path (CPUID + XGETBV).
//   kScalar: always.  kAvx2: AVX2 + FMA + F16C, OS saves YMM state.
//   kAvx512: the kAvx2 requirements + AVX-512 F/BW/VL/DQ, OS saves ZMM and opmask state.
bool IsaSupported(Isa isa);

// The fastest supported Isa on this CPU.
Isa BestIsa();

// "scalar" | "avx2" | "avx512" | "auto" (= BestIsa()).
// Errors: kInvalidArgument for any other name; kUnsupported when this CPU lacks the named ISA.
Result<Isa> ParseIsa(std::string_view name);

}  // namespace bitroll::kernels
