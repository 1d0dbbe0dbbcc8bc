// Weight update latency through the service: a path update (every replica loads a file) vs the
// same weights streamed from the client in parts (UpdateWeights with tensors), on a random model.
// Reports the median of --reps alternating runs of each and the streamed throughput (MB/s of
// tensor data, client memory to every replica installed). Run by hand; docs/benchmarks.md has
// the command and results.
//
//   bench_weights_update [--shape stories15m] [--replicas 1] [--reps 5] [--part-mb 1]
//                        [--work DIR] [--default-malloc]
// --default-malloc keeps glibc's defaults instead of rollout/malloc_tuning.h's (bitroll serve's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "engine/weight_update.h"
#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/malloc_tuning.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

int Fail(const Status& s) {
  std::fprintf(stderr, "bench_weights_update: %s\n", s.ToString().c_str());
  return 1;
}

using bench::Median;

int Run(int argc, char** argv) {
  std::string shape_name = "stories15m", work = "/tmp/bitroll_bench_weights";
  int replicas = 1, reps = 5, part_mb = 1;
  bench::BenchFlags flags;
  flags.strings = {{"--shape", &shape_name}, {"--work", &work}};
  flags.ints = {{"--replicas", &replicas}, {"--reps", &reps}, {"--part-mb", &part_mb}};
  bool default_malloc = false;
  flags.switches = {{"--default-malloc", &default_malloc}};
  if (!flags.Parse(argv[0], argc, argv)) return flags.ExitStatus();
  if (!default_malloc) rollout::TuneMallocForService();  // as `bitroll serve` does
  auto shape = engine::NamedShape(shape_name);
  if (!shape.ok()) {
    std::fprintf(stderr, "%s\n", shape.status().ToString().c_str());
    return 2;
  }
  std::filesystem::create_directories(work);
  const std::string a = work + "/a.bin", b = work + "/b.bin", tok = work + "/tok.bin";
  for (auto [path, seed] : {std::pair{a, 1}, std::pair{b, 2}}) {
    Status s = engine::WriteRandomModel(*shape, seed, path, tok);
    if (!s.ok()) return Fail(s);
  }
  auto source = engine::LoadModelWeights(b);
  if (!source.ok()) return Fail(source.status());
  std::vector<rollout::WeightTensor> tensors;
  size_t bytes = 0;
  for (const auto& t : engine::TensorManifest(*source)) {
    tensors.push_back(
        {t.name, std::string(DTypeName(t.tensor.dtype)), t.tensor.shape, t.tensor.data});
    bytes += static_cast<size_t>(t.tensor.size_bytes());
  }

  rollout::CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < replicas; ++i) {
    engine::EngineOptions eo;
    eo.model_path = a;
    eo.tokenizer_path = tok;
    eo.kv_cache_bytes = 256ll << 20;
    auto e = engine::OpenEngine(eo);
    if (!e.ok()) return Fail(e.status());
    engines.push_back(std::move(*e));
  }
  auto coord = rollout::Coordinator::Start(o, std::move(engines));
  if (!coord.ok()) return Fail(coord.status());
  rollout::ClientOptions co;
  co.endpoint = (*coord)->endpoint();
  auto client = rollout::Client::Connect(co);
  if (!client.ok()) return Fail(client.status());

  std::vector<double> path_s, stream_s;
  uint64_t version = 1;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    auto v = (*client)->UpdateWeights(b, version++, false, 600000);
    path_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    auto w = (*client)->UpdateWeightsStreamed(tensors, version++, false, true, 600000,
                                              static_cast<size_t>(part_mb) << 20);
    stream_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!v.ok() || !w.ok()) {
      std::fprintf(stderr, "update failed: %s %s\n", v.status().ToString().c_str(),
                   w.status().ToString().c_str());
      return 1;
    }
  }
  const double mp = Median(path_s), ms = Median(stream_s);
  std::printf("shape %s, %zu tensors, %.1f MB, %d replica(s), parts of %d MiB, %d reps, %s\n",
              shape_name.c_str(), tensors.size(), bytes / 1e6, replicas, part_mb, reps,
              default_malloc ? "glibc default malloc" : "tuned malloc");
  std::printf("| update | median s | MB/s of weights |\n|---|---|---|\n");
  std::printf("| path (each replica loads the file) | %.3f | %.0f |\n", mp, bytes / 1e6 / mp);
  std::printf("| streamed from the client | %.3f | %.0f |\n", ms, bytes / 1e6 / ms);
  std::printf("streamed / path time: %.2f\n", ms / mp);
  (*coord)->Stop();
  std::filesystem::remove_all(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return Run(argc, argv);
}
