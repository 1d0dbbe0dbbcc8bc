// Scalar row ops: the readable definitions of the canonical orders in ops.h.

#include <cmath>

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops_internal.h"

namespace bitroll::kernels::internal {
namespace {

// deterministic: lane order (element i -> lane i % 16, in increasing i; fixed tree); depends on n
// only.
float SumSquares(const float* x, int64_t n) {
  float lane[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = std::fma(x[i], x[i], lane[i % kLanes]);
  return ReduceSum16(lane);
}

// deterministic: exact; -0/+0 ties resolved by lane order and MaxKeep.
float MaxValue(const float* x, int64_t n) {
  float lane[kLanes];
  for (float& l : lane) l = -INFINITY;
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = MaxKeep(lane[i % kLanes], x[i]);
  return ReduceMax16(lane);
}

// deterministic: lane order, as SumSquares; Exp is the project's polynomial.
float SumExpShifted(const float* x, int64_t n, float shift) {
  float lane[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = lane[i % kLanes] + Exp(x[i] - shift);
  return ReduceSum16(lane);
}

// deterministic: the element-wise ops below apply fixed IEEE operations to each element.
void SubSub(const float* x, int64_t n, float a, float b, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - a) - b;
}

void ScaleMul(const float* x, const float* weight, int64_t n, float inv, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (inv * x[i]);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g * (1.0f / (1.0f + Exp(-g)))) * up[i];
  }
}

void Add(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
          RopeLayout layout) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;  // v [head_dim]
    for (int64_t i = 0; i < half; ++i) {
      float* p0 = layout == RopeLayout::kInterleaved ? v + 2 * i : v + i;
      float* p1 = layout == RopeLayout::kInterleaved ? v + 2 * i + 1 : v + i + half;
      const float x0 = *p0, x1 = *p1, c = cos[i], s = sin[i];
      *p0 = x0 * c - x1 * s;  // -ffp-contract=off: mul, mul, sub
      *p1 = x0 * s + x1 * c;
    }
  }
}

}  // namespace

const OpsTable kOpsScalar = {SumSquares, MaxValue, SumExpShifted, SubSub,
                             ScaleMul,   SwiGlu,   Add,           Rope};

}  // namespace bitroll::kernels::internal
