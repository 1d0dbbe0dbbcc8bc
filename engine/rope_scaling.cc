// engine/rope_scaling.cc: RoPE tables with Llama 3 scaling (see the header).
#include "engine/rope_scaling.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace bitroll::engine {

float Llama3RopeFrequency(const ModelConfig& c, int64_t i) {
  const int64_t hd = c.head_dim();
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(hd);
  const float freq = 1.0f / static_cast<float>(std::pow(static_cast<double>(c.rope_theta),
                                                        static_cast<double>(exponent)));
  const double f = freq, factor = c.rope_factor, lo = c.rope_low_freq_factor,
               hi = c.rope_high_freq_factor, old_len = c.rope_original_max_pos;
  const double wavelen = 2.0 * M_PI / f;
  const double low_wavelen = old_len / lo, high_wavelen = old_len / hi;
  if (wavelen < high_wavelen) return freq;
  if (wavelen > low_wavelen) return static_cast<float>(f / factor);
  const double s = (old_len / wavelen - lo) / (hi - lo);
  return static_cast<float>((1.0 - s) * f / factor + s * f);
}

void ModelRopeTables(const ModelConfig& c, float* cos, float* sin) {
  const int64_t hd = c.head_dim(), half = hd / 2, max_pos = c.max_seq_len;
  if (c.rope_factor == 0.0f) {
    kernels::RopeTable(c.rope_theta, hd, max_pos, cos, sin);
    return;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float freq = Llama3RopeFrequency(c, i);
    for (int64_t pos = 0; pos < max_pos; ++pos) {
      const float val = static_cast<float>(pos) * freq;
      cos[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(val)));
      sin[pos * half + i] = static_cast<float>(std::sin(static_cast<double>(val)));
    }
  }
}

}  // namespace bitroll::engine
