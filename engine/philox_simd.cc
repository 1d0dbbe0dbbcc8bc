// engine/philox_simd.cc: run-time dispatch for UniformOpenBatch (see philox_simd.h).
#include "engine/philox_simd.h"

#include "engine/philox.h"

namespace bitroll::engine {

void UniformOpenBatchIsa(kernels::Isa isa, uint64_t seed, uint32_t sample_index, int64_t position,
                         const int32_t* tokens, int64_t n, double* out) {
  switch (isa) {
    case kernels::Isa::kAvx512:
      return UniformOpenBatchAvx512(seed, sample_index, position, tokens, n, out);
    case kernels::Isa::kAvx2:
      return UniformOpenBatchAvx2(seed, sample_index, position, tokens, n, out);
    case kernels::Isa::kScalar:
      break;
  }
  UniformOpenBatch(seed, sample_index, position, tokens, n, out);
}

}  // namespace bitroll::engine
