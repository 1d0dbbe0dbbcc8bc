// kernels/cpu/philox_simd.cc: run-time dispatch for UniformOpenBatch (see philox_simd.h).
#include "kernels/cpu/philox_simd.h"

#include "kernels/cpu/philox.h"

namespace bitroll::kernels {

void UniformOpenBatchIsa(Isa isa, uint64_t seed, uint32_t sample_index, int64_t position,
                         const int32_t* tokens, int64_t n, double* out) {
  switch (isa) {
    case Isa::kAvx512:
      return UniformOpenBatchAvx512(seed, sample_index, position, tokens, n, out);
    case Isa::kAvx2:
      return UniformOpenBatchAvx2(seed, sample_index, position, tokens, n, out);
    case Isa::kScalar:
      break;
  }
  UniformOpenBatch(seed, sample_index, position, tokens, n, out);
}

}  // namespace bitroll::kernels
