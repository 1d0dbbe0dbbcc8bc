#include "engine/invariance_break.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace bitroll::engine {

void BatchVariantMatmul(kernels::Isa isa, const kernels::MatmulParams& p,
                        kernels::ThreadPool* pool) {
  if (p.m == 1) {
    kernels::Matmul(isa, p, pool);
    return;
  }
  const int64_t n = p.w->n(), k = p.w->k(), half = k / 2;
  std::vector<float> w(k);
  for (int64_t j = 0; j < n; ++j) {
    p.w->UnpackRow(j, w.data());
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = p.x + i * p.ldx;
      float a = 0.0f, b = 0.0f;
      for (int64_t kk = 0; kk < half; ++kk) a = std::fma(x[kk], w[kk], a);
      for (int64_t kk = half; kk < k; ++kk) b = std::fma(x[kk], w[kk], b);
      float acc = a + b;
      if (p.bias != nullptr) acc += p.bias[j];
      p.y[i * p.ldy + j] = acc;
    }
  }
}

Result<MatmulFn> TestBreakMatmulFromEnv() {
  const char* v = std::getenv(kTestBreakInvarianceEnv);
  if (v == nullptr || *v == '\0') return MatmulFn{nullptr};
  if (std::string(v) == "matmul") return &BatchVariantMatmul;
  if (std::string(v) == "expert_matmul" || std::string(v) == "window_chunk" ||
      std::string(v) == "late_rebuild" || std::string(v) == "sibling_tile") {
    return MatmulFn{nullptr};
  }
  return Status::InvalidArgument(std::string(kTestBreakInvarianceEnv) + "='" + v +
                                 "': the test switches are 'matmul', 'expert_matmul', "
                                 "'window_chunk', 'late_rebuild' and 'sibling_tile' (unset it "
                                 "to serve)");
}

MatmulFn TestBreakExpertMatmulFromEnv() {
  const char* v = std::getenv(kTestBreakInvarianceEnv);
  return v != nullptr && std::string(v) == "expert_matmul" ? &BatchVariantMatmul : nullptr;
}

bool TestBreakWindowChunkFromEnv() {
  const char* v = std::getenv(kTestBreakInvarianceEnv);
  return v != nullptr && std::string(v) == "window_chunk";
}

bool TestBreakSiblingTileFromEnv() {
  const char* v = std::getenv(kTestBreakInvarianceEnv);
  return v != nullptr && std::string(v) == "sibling_tile";
}

bool TestBreakLateRebuildFromEnv() {
  const char* v = std::getenv(kTestBreakInvarianceEnv);
  return v != nullptr && std::string(v) == "late_rebuild";
}

}  // namespace bitroll::engine
