#include "kernels/cpu/math_avx512.h"
#include "kernels/cpu/math_test_simd.h"

namespace bitroll::kernels::testing {

void Exp16Array(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, Exp16(_mm512_loadu_ps(x + i)));
}

float ReduceSum16Avx512(const float* lanes) {
  return ReduceSum16(_mm512_loadu_ps(lanes));
}

float ReduceMax16Avx512(const float* lanes) {
  return ReduceMax16(_mm512_loadu_ps(lanes));
}

}  // namespace bitroll::kernels::testing
