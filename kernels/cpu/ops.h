// Row ops for the CPU forward pass: reductions, normalisation, activations, RoPE.
//
// Every op takes `Isa isa` first. REQUIRES: IsaSupported(isa). The scalar, AVX2 and AVX-512 paths
// give IDENTICAL bits for every input and size (tested with memcmp in ops_test.cc).
//
// deterministic: reductions use the canonical 16-lane order of math.h ("lane order"): element i
// goes to lane i % 16, each lane accumulates its elements in increasing i, and the lanes combine by
// the fixed tree `for w in 8,4,2,1: lane[j] = lane[j] + lane[j+w] (j < w)`; the result is lane[0].
// The order depends only on n. Element-wise ops apply the same IEEE operations to each element.
// Transcendentals are math.h's Exp/Log, never libm.
//
// Pointers are not owned. Unless stated, input and output arrays may alias exactly (in place) but
// must not partially overlap. Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace bitroll::kernels {

// Lane order: lane acc = fmaf(x[i], x[i], acc). n >= 0 (n == 0 returns 0).
float SumSquares(Isa isa, const float* x, int64_t n);

// Exact maximum. REQUIRES: n >= 1, no NaN. Ties between -0 and +0 resolve by lane order with the
// MaxKeep rule of math.h.
float MaxValue(Isa isa, const float* x, int64_t n);

// Lane order: lane acc = acc + Exp(x[i] - shift). n >= 0.
float SumExpShifted(Isa isa, const float* x, int64_t n, float shift);

// m + Log(SumExpShifted(x, n, m)) with m = MaxValue(x, n). REQUIRES: n >= 1, no NaN, finite max.
float LogSumExp(Isa isa, const float* x, int64_t n);

// out[i] = (x[i] - m) - Log(SumExpShifted(x, n, m)), m = MaxValue(x, n). Same REQUIRES as
// LogSumExp. out may alias x.
void LogSoftmax(Isa isa, const float* x, int64_t n, float* out);

// out[i] = weight[i] * (inv * x[i]) with inv = 1.0f / sqrtf(SumSquares(x, dim) / (float)dim + eps)
// (llama2.c's operation order). REQUIRES: dim >= 1. out may alias x.
void RmsNorm(Isa isa, const float* x, const float* weight, int64_t dim, float eps, float* out);

// out[i] = (g[i] * (1.0f / (1.0f + Exp(-g[i])))) * up[i], g = gate. out may alias gate or up.
void SwiGlu(Isa isa, const float* gate, const float* up, int64_t n, float* out);

// acc[i] = acc[i] + x[i].
void Add(Isa isa, float* acc, const float* x, int64_t n);

// kInterleaved: llama2.c pairs (2i, 2i+1). kHalfSplit: HF/NeoX pairs (i, i + head_dim/2).
enum class RopeLayout : uint8_t { kInterleaved, kHalfSplit };

// Rotates n_heads heads of size head_dim (contiguous, x [n_heads][head_dim]) in place; cos/sin hold
// head_dim/2 values for this position (pair i uses cos[i], sin[i]).
//   out0 = x0*c - x1*s; out1 = x0*s + x1*c   (explicit mul then sub/add, NO fma)
// REQUIRES: head_dim even and >= 2.
void Rope(Isa isa, float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
          RopeLayout layout);

// Fills cos/sin tables [max_pos][head_dim/2]:
//   freq_i = 1.0f / (float)pow((double)theta, (double)((float)(2*i) / (float)head_dim));
//   val = (float)pos * freq_i (float multiply); cos = (float)std::cos((double)val), sin likewise.
// This mirrors llama2.c's float formula while computing pow/cos/sin in double, so libm differences
// vanish (the double results round to the same float on any conforming libm in practice).
// REQUIRES: head_dim even and >= 2, max_pos >= 0.
void RopeTable(float theta, int64_t head_dim, int64_t max_pos, float* cos, float* sin);

}  // namespace bitroll::kernels
