// engine/rope_scaling.h: the RoPE cos/sin tables of a model, with Llama 3's frequency scaling.
//
// Without scaling (ModelConfig::rope_factor == 0) the tables are kernels::RopeTable's, bit for
// bit. With rope_type "llama3" each frequency freq_i of kernels::RopeTable (a float) is rescaled
// in double as transformers' _compute_llama3_parameters does:
//   wavelen = 2*pi / freq_i; low = original_max_pos / low_freq_factor;
//   high = original_max_pos / high_freq_factor
//   wavelen < high            -> freq_i
//   wavelen > low             -> freq_i / factor
//   otherwise (smooth s = (original_max_pos / wavelen - low_freq_factor) /
//                         (high_freq_factor - low_freq_factor))
//                             -> (1 - s) * freq_i / factor + s * freq_i
// then rounded to float; val = (float)pos * freq (float multiply), cos/sin computed in double and
// rounded, as in kernels::RopeTable.
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <cstdint>

#include "engine/model_weights.h"

namespace bitroll::engine {

// Fills cos/sin [max_seq_len][head_dim / 2] for config `c`. REQUIRES: c.Validate().ok().
void ModelRopeTables(const ModelConfig& c, float* cos, float* sin);

// The rescaled float frequency of pair i (exposed for tests). REQUIRES: c.rope_factor != 0.
float Llama3RopeFrequency(const ModelConfig& c, int64_t i);

}  // namespace bitroll::engine
