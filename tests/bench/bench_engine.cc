// Engine benchmark (run by hand; never by ctest):
//   build/tests/bench_engine [--models-dir DIR] [--work DIR] [--reps N] [--quick]
//                            [--model stories260K|stories110m] [--batch B] [--threads T]
//   build/tests/bench_engine --attention-suite [--work DIR] [--reps N] [--threads T]
//                            [--kv-dtype f32|bf16] [--weights f32|bf16] [--case SUBSTRING]
//
// --attention-suite: the regimes where attention dominates (docs/benchmarks.md, "Attention"), on
// a random-weight stories110m shape with an 8,192-token context (written into --work on first
// use), fp32, greedy: decode tok/s at batch 1 after a 256- and a 4,096-token prompt, prefill tok/s
// of 512- and 4,096-token prompts (the steps before the first token, default prefill chunking),
// batch 32 of 128-token prompts + 128 generated tokens (decode steps only), and batch-1 decode at
// context 256 with the attention kernel forced to single and to split. One line per case and rep,
// then a table of medians. --kv-dtype / --weights: the KV cache's and the matmul weights' storage;
// --case: only the cases whose name contains SUBSTRING.
//
// Decode tok/s at batch 1, 8, 32, 64 with 1 and 2 threads, and prefill tok/s, on stories260K and
// on a random-weight stories110m (written with make-model into --work on first use), with fp32
// and bf16 weight storage. Also the invariance overhead: the same run with the split-tail
// attention disabled (single only) and with every item split. Reports achieved GFLOP/s (2 flops
// per multiply-add of the matmuls, plus attention) so it can be set against the FMA peak that
// bench_kernels measures. Prints one table; each figure is the median of --reps runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Config {
  int batch;
  int threads;
  std::string attention = "auto";
  kernels::DType storage = kernels::DType::kF32;
  bool sampled = false;  // T=1 top-p 0.9 instead of greedy (llama-bench compares without sampling)
  kernels::DType kv = kernels::DType::kF32;  // KV cache element type
};

using bench::Median;

// Matmul flops per token (2 per multiply-add), excluding attention.
double MatmulFlopsPerToken(const engine::ModelConfig& c) {
  const double dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
  const double per_layer = dim * (dim + 2 * kv) + dim * dim + 3 * dim * hidden;
  return 2.0 * (c.n_layers * per_layer + dim * c.vocab_size);
}

std::unique_ptr<engine::CpuEngine> Make(std::shared_ptr<const engine::ModelWeights> w,
                                        const Config& cfg, int step_tokens) {
  engine::CpuEngineParts parts;
  parts.weights = std::move(w);
  parts.options.threads = cfg.threads;
  parts.options.attention = cfg.attention;
  parts.options.max_step_tokens = step_tokens;
  parts.options.kv_cache_bytes = 1ll << 30;
  parts.weight_storage = cfg.storage;
  parts.options.kv_dtype = cfg.kv == kernels::DType::kBF16 ? "bf16" : "f32";
  auto e = engine::CpuEngine::Create(std::move(parts));
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

// Steady-state decode: `batch` sequences with a 16-token prompt; only steps in which every row is
// a decode row are timed.
double DecodeTokPerSec(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg,
                       int tokens) {
  auto e = Make(w, cfg, 4096);
  for (int i = 0; i < cfg.batch; ++i) {
    engine::SequenceRequest r;
    r.id = i;
    r.prompt.push_back(1);
    for (int k = 0; k < 15; ++k) r.prompt.push_back(3 + (i * 31 + k * 7) % 200);
    r.sampling.temperature = cfg.sampled ? 1.0f : 0.0f;
    r.sampling.top_p = 0.9f;
    r.sample_index = i;
    r.stop.max_tokens = tokens;
    r.stop.stop_at_eos = r.stop.stop_at_bos = false;
    (void)e->Add(r);
  }
  double secs = 0;
  int64_t decoded = 0;
  while (e->HasWork()) {
    auto s = e->Step();
    if (!s.ok()) std::exit(1);
    if (s->tokens_processed == cfg.batch && static_cast<int>(s->tokens.size()) == cfg.batch) {
      secs += s->seconds;
      decoded += cfg.batch;
    }
  }
  return secs > 0 ? decoded / secs : 0.0;
}

double PrefillTokPerSec(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg, int len) {
  auto e = Make(w, cfg, len);
  engine::SequenceRequest r;
  r.id = 1;
  for (int k = 0; k < len; ++k) r.prompt.push_back(3 + (k * 13) % 250);
  r.stop.max_tokens = 1;
  (void)e->Add(r);
  const auto t0 = Clock::now();
  while (e->HasWork()) (void)e->Step();
  return len / std::chrono::duration<double>(Clock::now() - t0).count();
}

// `batch` sequences with a `prompt_len`-token prompt, then `gen` generated tokens each. Returns
// decode tok/s over the steps in which every row is a decode row; *prefill_tps gets the prompt
// tokens per second of the steps before the first token (default prefill chunking).
double ContextRun(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg, int prompt_len,
                  int gen, double* prefill_tps) {
  auto e = Make(w, cfg, 4096);
  for (int i = 0; i < cfg.batch; ++i) {
    engine::SequenceRequest r;
    r.id = i;
    r.prompt.push_back(1);
    for (int k = 1; k < prompt_len; ++k) r.prompt.push_back(3 + (i * 31 + k * 13) % 250);
    r.sampling.temperature = 0.0f;
    r.sample_index = i;
    r.stop.max_tokens = gen;
    r.stop.stop_at_eos = r.stop.stop_at_bos = false;
    (void)e->Add(r);
  }
  double decode_s = 0, prefill_s = 0;
  int64_t decoded = 0;
  bool first_token = false;
  while (e->HasWork()) {
    auto s = e->Step();
    if (!s.ok()) std::exit(1);
    if (!first_token) prefill_s += s->seconds;
    if (!s->tokens.empty()) first_token = true;
    if (s->tokens_processed == cfg.batch && static_cast<int>(s->tokens.size()) == cfg.batch) {
      decode_s += s->seconds;
      decoded += cfg.batch;
    }
  }
  if (prefill_tps != nullptr) {
    *prefill_tps = prefill_s > 0 ? static_cast<double>(prompt_len) * cfg.batch / prefill_s : 0.0;
  }
  return decode_s > 0 ? decoded / decode_s : 0.0;
}

int AttentionSuite(const std::string& work, int reps, int threads, kernels::DType kv,
                   kernels::DType weights, const std::string& only) {
  const std::string path = work + "/stories110m-8k/model.bin";
  if (!std::filesystem::exists(path)) {
    auto shape = engine::NamedShape("stories110m");
    if (!shape.ok()) return 1;
    shape->max_seq_len = 8192;
    std::filesystem::create_directories(work + "/stories110m-8k");
    std::fprintf(stderr, "writing random-weight stories110m (8k context) to %s ...\n",
                 path.c_str());
    if (!engine::WriteRandomModel(*shape, 1, path, work + "/stories110m-8k/tokenizer.bin").ok()) {
      std::fprintf(stderr, "cannot write the model\n");
      return 1;
    }
  }
  auto lw = engine::LoadModelWeights(path);
  if (!lw.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), lw.status().ToString().c_str());
    return 1;
  }
  auto w = std::make_shared<const engine::ModelWeights>(std::move(lw).value());
  struct Case {
    const char* name;
    int batch, prompt, gen;
    const char* attention;
  };
  // The 4,096-token cases report both the prefill of their prompt and the decode after it.
  const Case cases[] = {
      {"b1 ctx256", 1, 256, 33, "auto"},        {"b1 ctx256 single", 1, 256, 33, "single"},
      {"b1 ctx256 split", 1, 256, 33, "split"}, {"b1 ctx4096", 1, 4096, 17, "auto"},
      {"b32 p128+128", 32, 128, 128, "auto"},   {"b1 prompt 512", 1, 512, 1, "auto"},
  };
  std::vector<std::vector<double>> decode(std::size(cases)), prefill(std::size(cases));
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < std::size(cases); ++i) {
      const Case& c = cases[i];
      if (std::string(c.name).find(only) == std::string::npos) continue;
      Config cfg{c.batch, threads, c.attention, weights};
      cfg.kv = kv;
      double pf = 0;
      const double dec = ContextRun(w, cfg, c.prompt, c.gen, &pf);
      decode[i].push_back(dec);
      prefill[i].push_back(pf);
      std::printf("rep %d | %s | prefill %.1f tok/s | decode %.1f tok/s\n", rep, c.name, pf, dec);
      std::fflush(stdout);
    }
  }
  std::printf("| case | threads | prefill tok/s | decode tok/s |\n|---|---|---|---|\n");
  for (size_t i = 0; i < std::size(cases); ++i) {
    if (std::string(cases[i].name).find(only) == std::string::npos) continue;
    std::printf("| %s | %d | %.1f | %.1f |\n", cases[i].name, threads, Median(prefill[i]),
                cases[i].gen > 1 ? Median(decode[i]) : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models_dir = "../shared/models";
  std::string work = "bench-work";
  int reps = 3;
  bool quick = false;
  std::string only_model;
  int only_batch = 0, only_threads = 0;
  bool attention_suite = false;
  std::string kv_dtype = "f32", weights = "f32", only_case;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--models-dir" && i + 1 < argc)
      models_dir = argv[++i];
    else if (a == "--work" && i + 1 < argc)
      work = argv[++i];
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--quick")
      quick = true;
    else if (a == "--attention-suite")
      attention_suite = true;
    else if (a == "--model" && i + 1 < argc)
      only_model = argv[++i];
    else if (a == "--batch" && i + 1 < argc)
      only_batch = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      only_threads = std::atoi(argv[++i]);
    else if (a == "--kv-dtype" && i + 1 < argc)
      kv_dtype = argv[++i];
    else if (a == "--weights" && i + 1 < argc)
      weights = argv[++i];
    else if (a == "--case" && i + 1 < argc)
      only_case = argv[++i];
  }
  std::filesystem::create_directories(work);
  if (attention_suite) {
    return AttentionSuite(work, reps, only_threads > 0 ? only_threads : 2,
                          kv_dtype == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32,
                          weights == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32,
                          only_case);
  }
  const std::string m110 = work + "/stories110m/model.bin";
  if (!std::filesystem::exists(m110)) {
    std::fprintf(stderr, "writing random-weight stories110m to %s ...\n", m110.c_str());
    auto shape = engine::NamedShape("stories110m");
    std::filesystem::create_directories(work + "/stories110m");
    if (!shape.ok() ||
        !engine::WriteRandomModel(*shape, 1, m110, work + "/stories110m/tokenizer.bin").ok()) {
      std::fprintf(stderr, "cannot write the stories110m model\n");
      return 1;
    }
  }
  struct Model {
    std::string name, path;
  };
  std::vector<Model> models = {{"stories260K", models_dir + "/stories260K.bin"},
                               {"stories110m", m110}};
  std::printf("| model | weights | threads | attention | sampling | batch | tok/s | GFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Model& m : models) {
    if (!only_model.empty() && m.name != only_model) continue;
    auto lw = engine::LoadModelWeights(m.path);
    if (!lw.ok()) {
      std::fprintf(stderr, "%s: %s\n", m.path.c_str(), lw.status().ToString().c_str());
      continue;
    }
    auto w = std::make_shared<const engine::ModelWeights>(std::move(lw).value());
    const double flops = MatmulFlopsPerToken(w->config);
    const bool big = m.name == "stories110m";
    const int tokens = big ? (quick ? 16 : 48) : 128;
    std::vector<Config> configs;
    for (kernels::DType st : {kernels::DType::kF32, kernels::DType::kBF16}) {
      if (!big && st == kernels::DType::kBF16) continue;
      for (int threads : {1, 2}) {
        for (int batch : {1, 8, 32, 64}) configs.push_back({batch, threads, "auto", st});
      }
    }
    if (big) {
      for (const char* att : {"single", "split"}) {
        for (int batch : {1, 32}) configs.push_back({batch, 2, att, kernels::DType::kF32});
      }
    }
    for (int batch : {1, 32}) configs.push_back({batch, 2, "auto", kernels::DType::kF32, true});
    for (const Config& c : configs) {
      if ((only_batch && c.batch != only_batch) || (only_threads && c.threads != only_threads))
        continue;
      std::vector<double> r;
      for (int i = 0; i < reps; ++i) r.push_back(DecodeTokPerSec(w, c, tokens));
      const double tps = Median(r);
      std::printf("| %s | %s | %d | %s | %s | %d | %.1f | %.1f |\n", m.name.c_str(),
                  c.storage == kernels::DType::kBF16 ? "bf16" : "f32", c.threads,
                  c.attention.c_str(), c.sampled ? "T=1 top-p 0.9" : "greedy", c.batch, tps,
                  tps * flops / 1e9);
      std::fflush(stdout);
    }
    for (int threads : {1, 2}) {
      if (only_batch || (only_threads && threads != only_threads)) continue;
      std::vector<double> r;
      const int len = big ? 512 : 256;
      for (int i = 0; i < reps; ++i) r.push_back(PrefillTokPerSec(w, {1, threads}, len));
      std::printf("| %s | f32 | %d | auto | - | prefill %d | %.1f | %.1f |\n", m.name.c_str(),
                  threads, len, Median(r), Median(r) * flops / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
