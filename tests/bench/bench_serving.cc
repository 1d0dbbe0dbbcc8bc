// Serving benchmark (run by hand; never by ctest):
//   build/tests/bench_serving [--work DIR] [--threads T] [--tokens N] [--reps R]
//
// On a random-weight stories110m (written into --work on first use, like bench_engine):
//   1. decode throughput under continuous batching: 64 sequences in flight, a finished one is
//      replaced at once by a new one with another length; tok/s over the decode-only steps and
//      over the whole run, against the best fixed batch (16, 32, 64 sequences of equal length
//      started together, decode-only steps, as bench_engine measures it);
//   2. GRPO: one 200-token prompt with n = 8 samples as one group (shared prefill) against 8
//      independent requests with the prefix cache off: wall time and prefill tokens computed;
//   3. time to first token of a 400-token prompt: cold against a prefix-cache hit;
//   4. peak RSS of the process.
// Each figure is the median of --reps runs. The machine is shared: read ratios, not absolutes.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string work = "bench-work";
  int threads = 2;
  int tokens = 24;
  int reps = 3;
};

using bench::Median;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::unique_ptr<engine::CpuEngine> Make(std::shared_ptr<const engine::ModelWeights> w,
                                        const Args& a, bool prefix_cache) {
  engine::CpuEngineParts parts;
  parts.weights = std::move(w);
  parts.options.threads = a.threads;
  parts.options.max_step_tokens = 512;
  parts.options.kv_cache_bytes = 1ll << 30;
  parts.options.prefix_cache = prefix_cache;
  auto e = engine::CpuEngine::Create(std::move(parts));
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

engine::SequenceRequest Request(uint64_t id, int prompt_len, int max_tokens, uint32_t salt) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt.push_back(1);
  for (int k = 1; k < prompt_len; ++k) r.prompt.push_back(3 + (salt * 131 + k * 7) % 30000);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.9f;
  r.sample_index = static_cast<uint32_t>(id % 8);
  r.stop.max_tokens = max_tokens;
  r.stop.stop_at_eos = r.stop.stop_at_bos = false;
  return r;
}

engine::StepResult MustStep(engine::Engine& e) {
  auto s = e.Step();
  if (!s.ok()) {
    std::fprintf(stderr, "step: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(s).value();
}

// Fixed batch: `batch` equal sequences started together; decode-only steps are timed.
double FixedBatchTokPerSec(std::shared_ptr<const engine::ModelWeights> w, const Args& a,
                           int batch) {
  auto e = Make(w, a, false);
  for (int i = 0; i < batch; ++i) (void)e->Add(Request(i, 16, a.tokens, i));
  double secs = 0;
  int64_t decoded = 0;
  while (e->HasWork()) {
    const engine::StepResult s = MustStep(*e);
    if (s.tokens_processed == batch && static_cast<int>(s.tokens.size()) == batch) {
      secs += s.seconds;
      decoded += batch;
    }
  }
  return secs > 0 ? decoded / secs : 0.0;
}

struct Continuous {
  double decode_tok_s = 0;  // decode-only steps
  double all_tok_s = 0;     // generated tokens over the whole run's wall time
};

// Continuous batching: 64 in flight; each finished sequence is replaced until `total` have run.
Continuous ContinuousBatching(std::shared_ptr<const engine::ModelWeights> w, const Args& a) {
  auto e = Make(w, a, true);
  const int in_flight = 64, total = 128;
  uint64_t next = 0;
  auto add = [&] {
    const int len = a.tokens / 2 + static_cast<int>(next * 7 % a.tokens);  // varied lengths
    (void)e->Add(Request(next, 16, std::max(1, len), static_cast<uint32_t>(next)));
    ++next;
  };
  for (int i = 0; i < in_flight; ++i) add();
  double decode_secs = 0;
  int64_t decoded = 0, generated = 0;
  const auto t0 = Clock::now();
  while (e->HasWork()) {
    const engine::StepResult s = MustStep(*e);
    generated += static_cast<int64_t>(s.tokens.size());
    if (s.tokens_processed == static_cast<int64_t>(s.tokens.size())) {
      decode_secs += s.seconds;
      decoded += s.tokens_processed;
    }
    for (size_t i = 0; i < s.finished.size() && next < static_cast<uint64_t>(total); ++i) add();
  }
  Continuous c;
  c.decode_tok_s = decode_secs > 0 ? decoded / decode_secs : 0;
  c.all_tok_s = generated / Seconds(t0);
  return c;
}

struct Grpo {
  double seconds = 0;
  int64_t prefill_computed = 0;
  int64_t prefill_cached = 0;
};

Grpo RunGroup(std::shared_ptr<const engine::ModelWeights> w, const Args& a, bool grouped) {
  auto e = Make(w, a, grouped);
  for (int i = 0; i < 8; ++i) {
    engine::SequenceRequest r = Request(i, 200, 16, 77);
    r.sample_index = i;
    r.group_id = grouped ? 1 : 0;
    (void)e->Add(r);
  }
  const auto t0 = Clock::now();
  while (e->HasWork()) MustStep(*e);
  Grpo g;
  g.seconds = Seconds(t0);
  g.prefill_computed = e->stats().prefill_tokens_computed;
  g.prefill_cached = e->stats().prefill_tokens_cached;
  return g;
}

// Seconds from Add() to the first token of a 400-token prompt.
double TimeToFirstToken(engine::CpuEngine& e, uint64_t id) {
  const auto t0 = Clock::now();
  (void)e.Add(Request(id, 400, 1, 5));
  while (e.HasWork()) {
    const engine::StepResult s = MustStep(e);
    if (!s.tokens.empty()) {
      const double t = Seconds(t0);
      while (e.HasWork()) MustStep(e);
      return t;
    }
  }
  return Seconds(t0);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::BenchFlags flags;
  flags.strings = {{"--work", &a.work}};
  flags.ints = {{"--threads", &a.threads}, {"--tokens", &a.tokens}, {"--reps", &a.reps}};
  if (!flags.Parse(argv[0], argc, argv)) return flags.ExitStatus();
  a.tokens = std::max(2, a.tokens);
  a.reps = std::max(1, a.reps);
  const std::string dir = a.work + "/stories110m";
  const std::string model = dir + "/model.bin";
  if (!std::filesystem::exists(model)) {
    std::fprintf(stderr, "writing random-weight stories110m to %s ...\n", model.c_str());
    std::filesystem::create_directories(dir);
    auto shape = engine::NamedShape("stories110m");
    if (!shape.ok() || !engine::WriteRandomModel(*shape, 1, model, dir + "/tokenizer.bin").ok()) {
      std::fprintf(stderr, "cannot write the stories110m model\n");
      return 1;
    }
  }
  auto lw = engine::LoadModelWeights(model);
  if (!lw.ok()) {
    std::fprintf(stderr, "%s: %s\n", model.c_str(), lw.status().ToString().c_str());
    return 1;
  }
  auto w = std::make_shared<const engine::ModelWeights>(std::move(lw).value());
  std::printf("bench_serving: stories110m (random weights), %d threads, %d tokens, %d reps\n\n",
              a.threads, a.tokens, a.reps);

  double best_fixed = 0;
  int best_batch = 0;
  for (int batch : {16, 32, 64}) {
    std::vector<double> v;
    for (int r = 0; r < a.reps; ++r) v.push_back(FixedBatchTokPerSec(w, a, batch));
    const double m = Median(v);
    std::printf("fixed batch %2d: decode %.1f tok/s\n", batch, m);
    if (m > best_fixed) best_fixed = m, best_batch = batch;
  }
  std::vector<double> dec, all;
  for (int r = 0; r < a.reps; ++r) {
    const Continuous c = ContinuousBatching(w, a);
    dec.push_back(c.decode_tok_s);
    all.push_back(c.all_tok_s);
  }
  std::printf(
      "continuous, 64 in flight: decode-only steps %.1f tok/s (%.2fx best fixed batch %d), "
      "whole run %.1f generated tok/s\n\n",
      Median(dec), best_fixed > 0 ? Median(dec) / best_fixed : 0.0, best_batch, Median(all));

  std::vector<double> tg, ti;
  Grpo g, ind;
  for (int r = 0; r < a.reps; ++r) {
    g = RunGroup(w, a, true);
    ind = RunGroup(w, a, false);
    tg.push_back(g.seconds);
    ti.push_back(ind.seconds);
  }
  std::printf(
      "GRPO n=8, 200-token prompt, 16 tokens: group %.3f s (prefill computed %lld, cached "
      "%lld) vs 8 independent %.3f s (computed %lld): %.2fx faster\n\n",
      Median(tg), static_cast<long long>(g.prefill_computed),
      static_cast<long long>(g.prefill_cached), Median(ti),
      static_cast<long long>(ind.prefill_computed), Median(ti) / Median(tg));

  std::vector<double> cold, warm;
  for (int r = 0; r < a.reps; ++r) {
    auto e = Make(w, a, true);
    cold.push_back(TimeToFirstToken(*e, 1));
    warm.push_back(TimeToFirstToken(*e, 2));
  }
  std::printf("time to first token, 400-token prompt: cold %.3f s, prefix hit %.3f s (%.1fx)\n\n",
              Median(cold), Median(warm), Median(cold) / Median(warm));

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS: %.1f MiB\n", ru.ru_maxrss / 1024.0);
  return 0;
}
