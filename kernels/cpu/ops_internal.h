// Internal to kernels/: the per-ISA row-op primitives behind ops.h. Not a public header.
// Each table entry has the same contract (and the same bits) on every ISA.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"

namespace bitroll::kernels::internal {

struct OpsTable {
  float (*sum_squares)(const float* x, int64_t n);                   // lane order, fma
  float (*max_value)(const float* x, int64_t n);                     // lane order, MaxKeep
  float (*sum_exp_shifted)(const float* x, int64_t n, float shift);  // lane order, acc + Exp
  // out[i] = (x[i] - a) - b
  void (*sub_sub)(const float* x, int64_t n, float a, float b, float* out);
  // out[i] = weight[i] * (inv * x[i])
  void (*scale_mul)(const float* x, const float* weight, int64_t n, float inv, float* out);
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* out);
  void (*add)(float* acc, const float* x, int64_t n);
  void (*rope)(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
               RopeLayout layout);
};

extern const OpsTable kOpsScalar;
extern const OpsTable kOpsAvx2;
extern const OpsTable kOpsAvx512;

}  // namespace bitroll::kernels::internal
