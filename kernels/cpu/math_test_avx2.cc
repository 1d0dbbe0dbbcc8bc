#include "kernels/cpu/math_avx2.h"
#include "kernels/cpu/math_test_simd.h"

namespace bitroll::kernels::testing {

void Exp8Array(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, Exp8(_mm256_loadu_ps(x + i)));
}

float ReduceSum16Avx2(const float* lanes) {
  return ReduceSum16(_mm256_loadu_ps(lanes), _mm256_loadu_ps(lanes + 8));
}

float ReduceMax16Avx2(const float* lanes) {
  return ReduceMax16(_mm256_loadu_ps(lanes), _mm256_loadu_ps(lanes + 8));
}

float HardwareF16ToF32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h))));
}

uint16_t HardwareF32ToF16(float f) {
  return static_cast<uint16_t>(
      _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

}  // namespace bitroll::kernels::testing
