// engine/make_model.h: reproducible random-weight llama2.c models for tests and benchmarks.
//
// WriteRandomModel writes a legacy llama2.c checkpoint (engine/loaders/llama2c.h) whose weights
// are a pure function of (shape, seed), plus a matching llama2.c tokenizer file, so any machine
// regenerates bit-identical files (and so the same weights_hash) without downloading anything.
//
// Weights: element i of the weight stream (all matrices and the embedding, in file order, norms
// and RoPE tables excluded) is
//     (x0, x1, x2, x3) = Philox4x32_10({uint32(i), uint32(i >> 32), 0x6D6F646C, 0}, seed)
//     w = (float)(0.02 * sqrt(3) * (x0 + x1 + x2 + x3) * 2^-32 - 2))   (Irwin-Hall, 4 terms)
// i.e. mean 0, standard deviation 0.02, bounded by +-0.0693. RMSNorm weights are 1.0f. The
// freq_cis tables are kernels::RopeTable(10000, head_dim, seq_len) (ignored by LoadLlama2c).
//
// Tokenizer: <unk>, "\n<s>\n", "\n</s>\n", the 256 byte pieces <0x00>..<0xFF> (score 0), then
// filler pieces: the 95 printable ASCII characters (space first, score 0), then every string of
// length 2, 3, 4 over " abcdefghijklmnopqrstuvwxyz" in order, with scores -1, -2, ..., until the
// vocabulary is full. Any text round-trips through it (byte fallback covers the rest).
//
// Thread-safety: pure functions of their arguments (and the files they write).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "schema/status.h"

namespace bitroll::engine {

struct ModelShape {
  std::string name;
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;
};

// The named shapes:
//   "stories110m"     768, 2048, 12, 12, 12, 32000, 1024
//   "stories110m-gqa" 768, 2048, 12, 12,  4, 32000, 1024
//   "stories15m"      288,  768,  6,  6,  6, 32000,  256
//   "stories260k"      64,  172,  5,  8,  4,   512,  512
//   "tiny"             32,   64,  2,  4,  2,   300,  128   (small and fast, for unit tests)
//   "qwen0.5b-like"   896, 4864, 24, 14,  2, 151936, 4096 (Qwen2.5-0.5B's sizes without its
//                     biases: 494M parameters, 1.98 GB as an fp32 file; the GPU benchmark
//                     tests/bench/bench_cuda_engine.cc builds it in memory instead)
// Errors: kNotFound for any other name (the message lists the known ones).
Result<ModelShape> NamedShape(std::string_view name);

// The shape named `name` in a table of shapes (anything with a `name`), or kNotFound listing the
// known names. Shared by NamedShape and NamedHfShape (engine/make_model_hf.h).
template <typename Shape, size_t N>
Result<Shape> FindShape(const Shape (&shapes)[N], std::string_view name) {
  std::string known;
  for (const Shape& s : shapes) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + std::string(s.name);
  }
  return Status::NotFound("no model shape named \"" + std::string(name) + "\" (known: " + known +
                          ")");
}

// Writes the checkpoint to `model_path` and the tokenizer to `tokenizer_path` (overwriting).
// Errors: kInvalidArgument (a shape ModelConfig::Validate rejects, or vocab_size < 259: the
// tokenizer needs <unk>, BOS, EOS and 256 byte pieces), kIoError (cannot create or write).
Status WriteRandomModel(const ModelShape& shape, uint64_t seed, const std::string& model_path,
                        const std::string& tokenizer_path);

}  // namespace bitroll::engine
