// MoE benchmark (run by hand; never by ctest):
//   build/tests/bench_moe [--work DIR] [--reps N] [--threads T] [--tokens N]
//
// make-model's moe-100m (Qwen3-MoE: 8 experts, top-2, 98M parameters, 42M active per token) and
// moe-100m-dense (the same model with one dense FFN of the MoE's active width: equal active
// parameters) are written into --work on first use. For each, decode tok/s at batch 1 and 32
// (16-token random prompts, --tokens generated, greedy, fp32), counting only pure decode steps;
// then the MoE at batch 32 with return_routing on every request: the cost of routing records.
// Each figure is the median of --reps runs, by wall clock and by process CPU time (the machine is
// shared: with --threads 1 the CPU-time rate is what the engine achieves when it has the core).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/loaders/hf.h"
#include "engine/make_model_hf.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

std::shared_ptr<const engine::ModelWeights> Load(const std::string& work, const std::string& name) {
  const std::string dir = work + "/" + name;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    auto shape = engine::NamedHfShape(name);
    if (!shape.ok() || !engine::WriteRandomHfModel(*shape, 1, dir).ok()) {
      std::fprintf(stderr, "cannot write %s\n", dir.c_str());
      std::exit(1);
    }
  }
  auto w = engine::LoadHuggingFace(dir);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    std::exit(1);
  }
  return std::make_shared<const engine::ModelWeights>(std::move(w).value());
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Rate {
  double wall = 0;  // decode tok/s by wall clock
  double cpu = 0;   // by process CPU time
};

// Decode tok/s of `batch` requests.
Rate DecodeRate(std::shared_ptr<const engine::ModelWeights> w, int batch, int threads, int tokens,
                bool routes) {
  engine::CpuEngineParts parts;
  parts.weights = w;
  parts.options.threads = threads;
  parts.options.kv_cache_bytes = 256ll << 20;
  parts.options.prefix_cache = false;
  auto e = engine::CpuEngine::Create(std::move(parts));
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  std::mt19937 rng(1);
  for (int i = 0; i < batch; ++i) {
    engine::SequenceRequest r;
    r.id = uint64_t(i + 1);
    for (int t = 0; t < 16; ++t) r.prompt.push_back(int32_t(3 + rng() % 30000));
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = tokens;
    r.stop.stop_at_eos = false;
    r.stop.stop_at_bos = false;
    r.return_routing = routes;
    if (!(*e)->Add(r).ok()) std::exit(1);
  }
  double seconds = 0, cpu = 0;
  int64_t decoded = 0;
  while ((*e)->HasWork()) {
    const auto t0 = Clock::now();
    const double c0 = CpuSeconds();
    auto s = (*e)->Step();
    const double dc = CpuSeconds() - c0;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) std::exit(1);
    if (s->tokens_processed == int64_t(s->tokens.size())) {  // a pure decode step
      seconds += dt;
      cpu += dc;
      decoded += s->tokens_processed;
    }
  }
  return {double(decoded) / seconds, double(decoded) / cpu};
}

using bench::Median;

}  // namespace

int main(int argc, char** argv) {
  std::string work = std::filesystem::temp_directory_path().string() + "/bitroll_bench_moe";
  int reps = 3, threads = 1, tokens = 64;
  bench::BenchFlags flags;
  flags.strings = {{"--work", &work}};
  flags.ints = {{"--reps", &reps}, {"--threads", &threads}, {"--tokens", &tokens}};
  if (!flags.Parse(argv[0], argc, argv)) return flags.ExitStatus();
  std::filesystem::create_directories(work);
  std::printf("%-16s %6s %8s %12s %12s\n", "model", "batch", "routes", "tok/s wall", "tok/s cpu");
  // Routing records: off and on alternate rep by rep (the machine's load drifts), at batch 32.
  {
    auto w = Load(work, "moe-100m");
    std::vector<double> off_wall, off_cpu, on_wall, on_cpu;
    for (int r = 0; r < reps; ++r) {
      const Rate a = DecodeRate(w, 32, threads, tokens, false);
      const Rate b = DecodeRate(w, 32, threads, tokens, true);
      off_wall.push_back(a.wall);
      off_cpu.push_back(a.cpu);
      on_wall.push_back(b.wall);
      on_cpu.push_back(b.cpu);
    }
    std::printf(
        "routes at batch 32, interleaved: off %.1f / %.1f tok/s, on %.1f / %.1f tok/s "
        "(wall / cpu); cost %.2f%% / %.2f%%\n",
        Median(off_wall), Median(off_cpu), Median(on_wall), Median(on_cpu),
        100.0 * (1.0 - Median(on_wall) / Median(off_wall)),
        100.0 * (1.0 - Median(on_cpu) / Median(off_cpu)));
    std::fflush(stdout);
  }
  for (const char* name : {"moe-100m", "moe-100m-dense"}) {
    auto w = Load(work, name);
    for (int batch : {1, 32}) {
      for (bool routes : {false, true}) {
        if (routes) continue;  // measured above, interleaved
        std::vector<double> wall, cpu;
        for (int r = 0; r < reps; ++r) {
          const Rate x = DecodeRate(w, batch, threads, tokens, routes);
          wall.push_back(x.wall);
          cpu.push_back(x.cpu);
        }
        std::printf("%-16s %6d %8s %12.1f %12.1f\n", name, batch, routes ? "yes" : "no",
                    Median(wall), Median(cpu));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
