// Service benchmark (run by hand; never by ctest):
//   build/tests/bench_service [--models DIR] [--work DIR] [--reps R] [--n N]
//                             [--trajectories T] [--tokens M] [--prompt-len P]
//                             [--trajectories-110m T] [--tokens-110m M] [--skip-110m]
//
// End-to-end generated tokens/s through the rollout service (in-process Coordinator on
// tcp://127.0.0.1, engines from engine::OpenEngine, one C++ client submitting one group of
// T/n prompts x n samples) against the engine alone (one CpuEngine stepping the same requests
// in-process, no ZeroMQ, no coordinator). Models: stories260K (from --models) and a random-weight
// stories110m written by engine::WriteRandomModel into --work on first use.
//
// Configurations per model:
//   engine t=1      one engine, 1 kernel thread
//   engine t=2      one engine, 2 kernel threads
//   service r=1     one replica (1 thread)                 ratio vs engine t=1: pure service
//   overhead service r=1t2   one replica with 2 kernel threads      ratio vs engine t=2: same, at 2
//   threads service r=2     two replicas of 1 thread each          ratio vs engine t=2: replicas vs
//   threads
// Each rep uses fresh prompts (so no configuration gets prefix-cache hits the other lacks), the
// engines are built once per configuration and outside the timing, and every service trajectory
// is checked bit-identical (memcmp) to the engine-alone one. Figures are medians over --reps; the
// machine is shared, so compare the ratios within one run, not absolutes across runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/make_model.h"
#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string models = BITROLL_MODELS_DIR;  // holds stories260K.bin and tok512.bin
  std::string work = "bench-work";          // the random stories110m goes here
  int reps = 3;
  int n = 4;               // samples per prompt (GRPO-style groups)
  int trajectories = 320;  // stories260K: prompts x n
  int tokens = 64;         // stories260K: max tokens per trajectory
  int prompt_len = 16;
  int trajectories_110m = 64;
  int tokens_110m = 16;
  bool skip_110m = false;
};

struct Workload {
  std::string name;
  engine::EngineOptions options;  // model_path, tokenizer_path, kv_cache_bytes
  int prompts = 0;
  int n = 0;
  int max_tokens = 0;
  int prompt_len = 0;
  int vocab = 0;
};

using bench::Median;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "bench_service: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// The prompts of one rep: BOS then pseudo-random ids, fresh for every rep.
std::vector<std::vector<int32_t>> Prompts(const Workload& w, int rep) {
  std::vector<std::vector<int32_t>> out(w.prompts);
  for (int p = 0; p < w.prompts; ++p) {
    out[p].push_back(1);
    for (int k = 1; k < w.prompt_len; ++k) {
      const uint32_t x = static_cast<uint32_t>(rep * 7919 + p * 131 + k * 17);
      out[p].push_back(static_cast<int32_t>(3 + (x * 2654435761u >> 8) % (w.vocab - 3)));
    }
  }
  return out;
}

constexpr uint64_t kSeed = 4242;
constexpr float kTopP = 0.9f;

std::unique_ptr<engine::Engine> Open(const Workload& w, int threads) {
  engine::EngineOptions o = w.options;
  o.threads = threads;
  auto e = engine::OpenEngine(o);
  if (!e.ok()) Die("open " + o.model_path, e.status());
  return std::move(e).value();
}

using Key = std::pair<uint32_t, uint32_t>;  // (prompt, sample)
struct Out {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};
using Outs = std::map<Key, Out>;

// The engine alone: every request added at once, Step() until idle. Returns generated tokens.
int64_t RunEngine(engine::Engine& e, const Workload& w, int rep, Outs* outs, double* secs) {
  const auto prompts = Prompts(w, rep);
  const auto t0 = Clock::now();
  for (int p = 0; p < w.prompts; ++p) {
    for (int s = 0; s < w.n; ++s) {
      engine::SequenceRequest r;
      r.id = static_cast<uint64_t>(p) * w.n + s;
      r.group_id = static_cast<uint64_t>(rep) * 100000 + p;
      r.prompt = prompts[p];
      r.sample_index = static_cast<uint32_t>(s);
      r.sampling.temperature = 1.0f;
      r.sampling.top_p = kTopP;
      r.sampling.seed = kSeed;
      r.stop.max_tokens = w.max_tokens;
      r.stop.stop_at_eos = false;
      if (Status st = e.Add(std::move(r)); !st.ok()) Die("engine add", st);
    }
  }
  int64_t tokens = 0;
  while (e.HasWork()) {
    auto step = e.Step();
    if (!step.ok()) Die("engine step", step.status());
    for (auto& f : step->finished) {
      tokens += static_cast<int64_t>(f.tokens.size());
      const Key k{static_cast<uint32_t>(f.id / w.n), static_cast<uint32_t>(f.id % w.n)};
      (*outs)[k] = {std::move(f.tokens), std::move(f.logprobs)};
    }
  }
  *secs = Seconds(t0);
  return tokens;
}

// Through the service: one group with every prompt x n, from Submit to GroupDone.
int64_t RunService(rollout::Client& c, const Workload& w, int rep, Outs* outs, double* secs) {
  rollout::SubmitRequest q;
  q.group_id = static_cast<uint64_t>(rep) + 1;
  q.prompts = Prompts(w, rep);
  q.n = static_cast<uint32_t>(w.n);
  q.temperature = 1.0f;
  q.top_p = kTopP;
  q.seed = kSeed;
  q.max_tokens = w.max_tokens;
  q.stop_at_eos = false;
  const auto t0 = Clock::now();
  auto r = c.Run(q, 600000);
  *secs = Seconds(t0);
  if (!r.ok()) Die("service run", r.status());
  int64_t tokens = 0;
  for (auto& t : *r) {
    if (!t.error.ok()) Die("trajectory", t.error);
    tokens += static_cast<int64_t>(t.ids.size());
    (*outs)[{t.prompt_index, t.sample_index}] = {std::move(t.ids), std::move(t.logprobs)};
  }
  return tokens;
}

bool Identical(const Outs& a, const Outs& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, x] : a) {
    auto it = b.find(k);
    if (it == b.end()) return false;
    const Out& y = it->second;
    if (x.ids.size() != y.ids.size() || x.logprobs.size() != y.logprobs.size() ||
        std::memcmp(x.ids.data(), y.ids.data(), 4 * x.ids.size()) != 0 ||
        std::memcmp(x.logprobs.data(), y.logprobs.data(), 4 * x.logprobs.size()) != 0) {
      return false;
    }
  }
  return true;
}

struct Figure {
  double tok_s = 0.0;
  double secs = 0.0;
  int64_t tokens = 0;
};

Figure Summarize(const std::vector<double>& secs, const std::vector<int64_t>& tokens) {
  std::vector<double> rates;
  for (size_t i = 0; i < secs.size(); ++i) rates.push_back(tokens[i] / std::max(secs[i], 1e-9));
  return {Median(rates), Median(secs), tokens.empty() ? 0 : tokens[0]};
}

void Bench(const Workload& w, const Args& a) {
  std::printf(
      "\n== %s: %d prompts x n=%d = %d trajectories, prompt %d tokens, max %d tokens, "
      "T=1 top-p %.1f, %d reps ==\n",
      w.name.c_str(), w.prompts, w.n, w.prompts * w.n, w.prompt_len, w.max_tokens,
      static_cast<double>(kTopP), a.reps);
  std::vector<std::vector<Outs>> ref(3);  // [threads] -> per rep
  std::map<std::string, Figure> fig;
  for (int threads : {1, 2}) {
    auto e = Open(w, threads);
    std::vector<double> secs;
    std::vector<int64_t> toks;
    for (int rep = 0; rep < a.reps; ++rep) {
      Outs o;
      double s = 0;
      toks.push_back(RunEngine(*e, w, rep, &o, &s));
      secs.push_back(s);
      ref[threads].push_back(std::move(o));
    }
    fig["engine t=" + std::to_string(threads)] = Summarize(secs, toks);
  }
  bool all_identical = true;
  for (int rep = 0; rep < a.reps; ++rep) {
    all_identical = all_identical && Identical(ref[2][rep], ref[1][rep]);
  }
  struct Service {
    const char* name;
    int replicas;
    int threads;
  };
  for (const Service& sv : {Service{"service r=1", 1, 1}, Service{"service r=1t2", 1, 2},
                            Service{"service r=2", 2, 1}}) {
    rollout::CoordinatorOptions co;
    co.bind = "tcp://127.0.0.1:*";
    std::vector<std::unique_ptr<engine::Engine>> engines;
    for (int i = 0; i < sv.replicas; ++i) engines.push_back(Open(w, sv.threads));
    auto coord = rollout::Coordinator::Start(co, std::move(engines));
    if (!coord.ok()) Die("coordinator", coord.status());
    rollout::ClientOptions clo;
    clo.endpoint = (*coord)->endpoint();
    auto client = rollout::Client::Connect(clo);
    if (!client.ok()) Die("client", client.status());
    std::vector<double> secs;
    std::vector<int64_t> toks;
    for (int rep = 0; rep < a.reps; ++rep) {
      Outs o;
      double s = 0;
      toks.push_back(RunService(**client, w, rep, &o, &s));
      secs.push_back(s);
      all_identical = all_identical && Identical(o, ref[1][rep]);
    }
    fig[sv.name] = Summarize(secs, toks);
    (*coord)->Stop();
  }
  for (const char* name :
       {"engine t=1", "engine t=2", "service r=1", "service r=1t2", "service r=2"}) {
    const Figure& f = fig[name];
    std::printf("  %-14s %8.1f tok/s   median %.3f s for %lld tokens\n", name, f.tok_s, f.secs,
                static_cast<long long>(f.tokens));
  }
  auto ratio = [&](const char* a_name, const char* b_name) {
    std::printf("  ratio %-14s / %-11s = %.3f\n", a_name, b_name,
                fig[a_name].tok_s / std::max(fig[b_name].tok_s, 1e-9));
  };
  ratio("service r=1", "engine t=1");
  ratio("service r=1t2", "engine t=2");
  ratio("service r=2", "engine t=2");
  ratio("engine t=2", "engine t=1");
  ratio("service r=2", "service r=1");
  std::printf("  engine t=2 and every service run bit-identical to engine t=1 (memcmp): %s\n",
              all_identical ? "yes" : "NO");
  std::fflush(stdout);
  if (!all_identical) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::BenchFlags flags;
  flags.strings = {{"--models", &a.models}, {"--work", &a.work}};
  flags.ints = {{"--reps", &a.reps},
                {"--n", &a.n},
                {"--trajectories", &a.trajectories},
                {"--tokens", &a.tokens},
                {"--prompt-len", &a.prompt_len},
                {"--trajectories-110m", &a.trajectories_110m},
                {"--tokens-110m", &a.tokens_110m}};
  flags.switches = {{"--skip-110m", &a.skip_110m}};
  if (!flags.Parse("bench_service", argc, argv)) return flags.ExitStatus();
  if (a.reps < 1 || a.n < 1 || a.trajectories < a.n || a.tokens < 1 || a.prompt_len < 1 ||
      a.trajectories_110m < a.n || a.tokens_110m < 1) {
    std::fprintf(stderr, "bench_service: sizes must be positive, trajectories >= n\n");
    return 2;
  }

  Workload small;
  small.name = "stories260K";
  small.options.model_path = a.models + "/stories260K.bin";
  small.options.tokenizer_path = a.models + "/tok512.bin";
  small.options.kv_cache_bytes = 256ll << 20;
  small.prompts = a.trajectories / a.n;
  small.n = a.n;
  small.max_tokens = a.tokens;
  small.prompt_len = a.prompt_len;
  small.vocab = 512;
  Bench(small, a);

  if (!a.skip_110m) {
    Result<engine::ModelShape> shape = engine::NamedShape("stories110m");
    if (!shape.ok()) Die("shape", shape.status());
    std::filesystem::create_directories(a.work);
    const std::string model = a.work + "/stories110m-random.bin";
    const std::string tok = a.work + "/stories110m-random.tok";
    if (!std::filesystem::exists(model) || !std::filesystem::exists(tok)) {
      std::printf("writing random-weight stories110m to %s ...\n", model.c_str());
      if (Status s = engine::WriteRandomModel(*shape, 1, model, tok); !s.ok()) Die("write", s);
    }
    Workload big;
    big.name = "stories110m (random weights)";
    big.options.model_path = model;
    big.options.tokenizer_path = tok;
    big.options.kv_cache_bytes = 512ll << 20;
    big.prompts = a.trajectories_110m / a.n;
    big.n = a.n;
    big.max_tokens = a.tokens_110m;
    big.prompt_len = a.prompt_len;
    big.vocab = shape->vocab_size;
    Bench(big, a);
  }
  return 0;
}
