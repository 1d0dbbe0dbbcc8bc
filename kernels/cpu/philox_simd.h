// kernels/cpu/philox_simd.h: SIMD twins of UniformOpenBatch (kernels/cpu/philox.h).
//
// Each returns exactly UniformOpenBatch's bits: the same 32x32->64 products, xors and key
// schedule per lane, the same exact uint64 -> double conversion, then the same add and multiply
// (no fma). They exist for speed only (Philox is multiply bound: vpmuludq does 4 or 8 products
// per instruction). Compiled per ISA (bitroll_isa_sources); callers dispatch at run time.
//
// REQUIRES: IsaSupported(kAvx2) / (kAvx512) respectively. Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace bitroll::kernels {

void UniformOpenBatchAvx2(uint64_t seed, uint32_t sample_index, int64_t position,
                          const int32_t* tokens, int64_t n, double* out);
void UniformOpenBatchAvx512(uint64_t seed, uint32_t sample_index, int64_t position,
                            const int32_t* tokens, int64_t n, double* out);

// UniformOpenBatch on the fastest path `isa` allows. REQUIRES: IsaSupported(isa).
void UniformOpenBatchIsa(Isa isa, uint64_t seed, uint32_t sample_index, int64_t position,
                         const int32_t* tokens, int64_t n, double* out);

}  // namespace bitroll::kernels
