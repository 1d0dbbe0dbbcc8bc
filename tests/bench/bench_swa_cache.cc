// The SWA prefix-cache policy trade-off (run by hand; never by ctest):
//   build/tests/bench_swa_cache [--work DIR] [--threads T] [--hits H] [--misses M]
//                               [--max-prefix N] [--checkpoint P]
//
// Model: a random-weight Gemma-3-style hybrid written into --work on first use (make-model's
// Hugging Face writer with a shape of its own: qwen3, dim 128, hidden 256, 6 layers of which 5
// slide with W = 128 and 1 is full, 2 heads of 64, 1 KV head, vocab 512, context 32896): every
// token keeps 512 bytes of full-layer K/V and 2560 bytes of sliding K/V (fp32). A rebuild spans
// L * (W - 1) = 635 tokens (640 rounded to blocks).
//
// Trace, per prefix length (1K, 2K, 4K, 8K, 16K, 32K, up to --max-prefix) and per policy (full,
// checkpoint:P, recompute), on a fresh engine with room for the whole trace: a warm-up request,
// the shared prefix alone (a miss: prefilled cold, its blocks enter the cache), then H hits (the
// shared prefix cut 16 * ((7h + 3) mod 32) tokens before its end, so hits end at different
// offsets from the checkpoint boundaries, plus a 16-token tail of their own), the first M of them
// each followed by a miss (a fresh random prompt of the prefix length). Every request is one
// token long and alone in the engine. Per policy:
//   stored B/tok  bytes the memory tier keeps per cached token (full + sliding layers), after the
//                 trace;
//   hit TTFT      median time to first token of the hits (100% hit rate);
//   TTFT @50%     the mean of the median hit and the median miss (one miss per hit);
//   recomp/hit    tokens a hit ran again for the sliding layers (rebuild or checkpoint gap);
//   miss TTFT     median cold prefill (the same work for every policy).
// The machine is shared: read ratios, not absolutes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/make_model_hf.h"
#include "engine/model_loader.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string work = "bench-work";
  int threads = 2;
  int hits = 5;
  int max_prefix = 32768;
  int checkpoint = 512;
  int misses = 2;
};

using bench::Median;

engine::HfModelShape BenchShape() {
  engine::HfModelShape s;
  s.name = "bench-swa-5to1";
  s.arch = "qwen3";
  s.dim = 128;
  s.hidden_dim = 256;
  s.n_layers = 6;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 64;
  s.vocab_size = 512;
  s.max_seq_len = 32768 + 128;
  s.sliding_window = 128;
  s.full_every = 6;
  return s;
}

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(3, 511)(rng);
  return t;
}

// Runs one request (prompt, one token) alone; returns the seconds to its first token.
double Ttft(engine::CpuEngine& e, uint64_t id, const std::vector<int32_t>& prompt) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = 1;
  const auto t0 = Clock::now();
  if (!e.Add(r).ok()) std::exit(1);
  while (e.HasWork()) {
    auto s = e.Step();
    if (!s.ok()) {
      std::fprintf(stderr, "step: %s\n", s.status().ToString().c_str());
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::BenchFlags flags;
  flags.strings["--work"] = &a.work;
  flags.ints["--threads"] = &a.threads;
  flags.ints["--hits"] = &a.hits;
  flags.ints["--max-prefix"] = &a.max_prefix;
  flags.ints["--checkpoint"] = &a.checkpoint;
  flags.ints["--misses"] = &a.misses;
  if (!flags.Parse("bench_swa_cache", argc, argv)) return flags.ExitStatus();
  const engine::HfModelShape shape = BenchShape();
  const std::string dir = a.work + "/" + shape.name;
  if (!std::filesystem::exists(dir + "/config.json")) {
    std::filesystem::create_directories(a.work);
    Status s = engine::WriteRandomHfModel(shape, 7, dir);
    if (!s.ok()) {
      std::fprintf(stderr, "make model: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  Result<engine::ModelWeights> loaded = engine::LoadModelWeights(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "load: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  auto weights = std::make_shared<const engine::ModelWeights>(std::move(loaded).value());
  const std::vector<std::string> policies = {"full", "checkpoint:" + std::to_string(a.checkpoint),
                                             "recompute"};
  std::printf("model %s: %d layers (%d sliding, W = %d), threads %d, %d hits per prefix\n\n",
              shape.name.c_str(), shape.n_layers,
              shape.n_layers - shape.n_layers / shape.full_every, shape.sliding_window, a.threads,
              a.hits);
  std::printf(
      "| prefix | policy | stored B/tok (full + sliding) | hit TTFT ms | TTFT @50%% ms | "
      "recomp/hit | miss TTFT ms |\n|---|---|---|---|---|---|---|\n");
  const auto bench_start = Clock::now();
  for (int prefix = 1024; prefix <= a.max_prefix; prefix *= 2) {
    const std::vector<int32_t> shared = Tokens(prefix, 1000 + prefix);
    for (const std::string& policy : policies) {
      engine::CpuEngineParts parts;
      parts.weights = weights;
      parts.options.threads = a.threads;
      parts.options.max_step_tokens = 512;
      parts.options.kv_cache_bytes = 768ll << 20;
      parts.options.swa_cache = policy;
      auto made = engine::CpuEngine::Create(std::move(parts));
      if (!made.ok()) {
        std::fprintf(stderr, "engine: %s\n", made.status().ToString().c_str());
        return 1;
      }
      engine::CpuEngine& e = **made;
      // A hit shares the prefix up to 16 * ((7h + 3) mod 32) tokens before its end, so the hit
      // lengths fall at different offsets from the checkpoint boundaries (multiples of 512).
      auto hit_prompt = [&](int h) {
        std::vector<int32_t> p(shared.begin(), shared.end() - 16 * ((7 * h + 3) % 32));
        const std::vector<int32_t> tail = Tokens(16, 5000 + h);
        p.insert(p.end(), tail.begin(), tail.end());
        return p;
      };
      auto miss_prompt = [&](int h) { return Tokens(prefix, 9000 + prefix + h); };
      Ttft(e, 1000, Tokens(64, 1));                       // warm-up: threads, scratch
      std::vector<double> misses = {Ttft(e, 1, shared)};  // caches the shared prefix
      std::vector<double> hits;
      int64_t recomputed = 0;
      for (int h = 0; h < a.hits; ++h) {
        const int64_t before = e.stats().swa_recomputed_tokens;
        hits.push_back(Ttft(e, 100 + h, hit_prompt(h)));
        recomputed += e.stats().swa_recomputed_tokens - before;
        if (h < a.misses) misses.push_back(Ttft(e, 200 + h, miss_prompt(h)));
      }
      const engine::EngineStats after = e.stats();
      const double cached_tokens = double(after.kv_blocks_cached * after.kv_block_tokens);
      const double full_b = after.prefix_cached_bytes_full / std::max(1.0, cached_tokens);
      const double sliding_b = after.prefix_cached_bytes_sliding / std::max(1.0, cached_tokens);
      const double hit = Median(hits);
      const double miss = Median(misses);
      std::printf("| %dK | %s | %.0f (%.0f + %.0f) | %.1f | %.1f | %.0f | %.1f |\n", prefix / 1024,
                  policy.c_str(), full_b + sliding_b, full_b, sliding_b, hit * 1e3,
                  (hit + miss) / 2 * 1e3, double(recomputed) / a.hits, miss * 1e3);
      std::fflush(stdout);
    }
  }
  std::printf("\ntotal %.0f s\n",
              std::chrono::duration<double>(Clock::now() - bench_start).count());
  return 0;
}
