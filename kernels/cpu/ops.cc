#include "kernels/cpu/ops.h"

#include <cmath>

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops_internal.h"

namespace bitroll::kernels {
namespace {

const internal::OpsTable& Ops(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return internal::kOpsAvx512;
    case Isa::kAvx2:
      return internal::kOpsAvx2;
    case Isa::kScalar:
      break;
  }
  return internal::kOpsScalar;
}

}  // namespace

float SumSquares(Isa isa, const float* x, int64_t n) {
  return Ops(isa).sum_squares(x, n);
}

float MaxValue(Isa isa, const float* x, int64_t n) {
  return Ops(isa).max_value(x, n);
}

float SumExpShifted(Isa isa, const float* x, int64_t n, float shift) {
  return Ops(isa).sum_exp_shifted(x, n, shift);
}

float LogSumExp(Isa isa, const float* x, int64_t n) {
  const internal::OpsTable& ops = Ops(isa);
  const float m = ops.max_value(x, n);
  return m + Log(ops.sum_exp_shifted(x, n, m));
}

void LogSoftmax(Isa isa, const float* x, int64_t n, float* out) {
  const internal::OpsTable& ops = Ops(isa);
  const float m = ops.max_value(x, n);
  const float log_sum = Log(ops.sum_exp_shifted(x, n, m));
  ops.sub_sub(x, n, m, log_sum, out);
}

void RmsNorm(Isa isa, const float* x, const float* weight, int64_t dim, float eps, float* out) {
  const internal::OpsTable& ops = Ops(isa);
  float ss = ops.sum_squares(x, dim);
  ss = ss / static_cast<float>(dim);
  ss = ss + eps;
  const float inv = 1.0f / std::sqrt(ss);  // IEEE sqrt: correctly rounded everywhere
  ops.scale_mul(x, weight, dim, inv, out);
}

void SwiGlu(Isa isa, const float* gate, const float* up, int64_t n, float* out) {
  Ops(isa).swiglu(gate, up, n, out);
}

void Add(Isa isa, float* acc, const float* x, int64_t n) {
  Ops(isa).add(acc, x, n);
}

void Rope(Isa isa, float* x, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin,
          RopeLayout layout) {
  Ops(isa).rope(x, n_heads, head_dim, cos, sin, layout);
}

void RopeTable(float theta, int64_t head_dim, int64_t max_pos, float* cos, float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float freq = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta),
                                                          static_cast<double>(exponent)));
    for (int64_t pos = 0; pos < max_pos; ++pos) {
      const float val = static_cast<float>(pos) * freq;
      cos[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(val)));
      sin[pos * half + i] = static_cast<float>(std::sin(static_cast<double>(val)));
    }
  }
}

}  // namespace bitroll::kernels
