// Test-only: array wrappers around the header-only SIMD math, compiled per ISA in
// math_test_avx2.cc / math_test_avx512.cc. Call only when the ISA is supported.
#pragma once

#include <cstdint>

namespace bitroll::kernels::testing {

// out[i] = Exp8/Exp16 lane of x[i]; n must be a multiple of 8 / 16.
void Exp8Array(const float* x, int64_t n, float* out);
void Exp16Array(const float* x, int64_t n, float* out);
// The lane-order reductions on 16 values.
float ReduceSum16Avx2(const float* lanes);
float ReduceMax16Avx2(const float* lanes);
float ReduceSum16Avx512(const float* lanes);
float ReduceMax16Avx512(const float* lanes);
// Hardware F16C conversion of one half (the reference for F16ToF32).
float HardwareF16ToF32(uint16_t h);
// Hardware F16C conversion of one float, round to nearest even (the reference for F32ToF16).
uint16_t HardwareF32ToF16(float f);

}  // namespace bitroll::kernels::testing
