// WAL overhead benchmark (run by hand; never by ctest):
//   build/tests/bench_wal_service [--models DIR] [--work DIR] [--reps R] [--n N]
//                                 [--trajectories T] [--tokens M] [--threads K]
//                                 [--trajectories-110m T] [--tokens-110m M] [--skip-110m]
//                                 [--metrics]
//
// Generated tokens/s through the whole rollout service (in-process Coordinator on tcp://127.0.0.1,
// one real engine replica, one C++ client submitting one GRPO-style group) with the token-level
// WAL in each durability mode, all at the default 10 ms group commit:
//   off      no --data-dir: nothing is logged (the baseline)
//   none     every record logged and committed, never fsynced (the cost of logging itself)
//   window   commits without fsync, one fsync at most every 100 ms (bounded power-loss window)
//   sync     every group commit fsynced (`bitroll serve --durability sync`, the default)
// Reps are interleaved (off, none, window, sync, off, ...), each on fresh prompts, and the
// trainer acknowledges every group so the WAL compacts as in a long run. Every trajectory of every
// mode is checked bit-identical (memcmp) to the WAL-off one of the same rep: the WAL never changes
// a bit. Bytes per token = sum of the trajectories' cost.wal_bytes / generated tokens.
// CPU us/token = the whole process's CPU time (user + system, every thread: engine, coordinator,
// WAL committer) during a run / its tokens. On a shared machine wall-clock rates swing with other
// load; the CPU time the WAL adds per token is the steadier measure of its cost.
// --metrics: the cost of --metrics-bind (rollout/metrics.h) instead: modes off, off+metrics, sync,
// sync+metrics, where +metrics serves /metrics on an ephemeral port and a scraper thread GETs it
// every second (a Prometheus at scrape_interval 1s); "metrics cost" compares each pair per rep,
// and odd reps run each pair in the other order (use an even --reps).
// Models: stories260K (its decode is so fast that it shows the WAL's worst case) and a random
// stories110m (a realistic decode rate), written into --work on first use.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/make_model.h"
#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/metrics.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string models = BITROLL_MODELS_DIR;
  std::string work = "bench-work";
  int reps = 5;
  int n = 8;
  int threads = 1;
  int trajectories = 256;
  int tokens = 200;
  int trajectories_110m = 32;
  int tokens_110m = 32;
  bool skip_110m = false;
  bool metrics = false;
};

[[noreturn]] void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "bench_wal_service: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

using bench::Median;

struct Mode {
  const char* name;
  bool wal;
  wal::Durability durability;
  bool metrics = false;
};
constexpr Mode kModes[] = {{"off", false, wal::Durability::kNone},
                           {"none", true, wal::Durability::kNone},
                           {"window", true, wal::Durability::kWindow},
                           {"sync", true, wal::Durability::kSyncEveryCommit}};
constexpr Mode kMetricsModes[] = {{"off", false, wal::Durability::kNone},
                                  {"off+metrics", false, wal::Durability::kNone, true},
                                  {"sync", true, wal::Durability::kSyncEveryCommit},
                                  {"sync+metrics", true, wal::Durability::kSyncEveryCommit, true}};
constexpr int kNumModes = 4;

// GET /metrics on 127.0.0.1:port; the bytes read (0 on failure).
size_t Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  size_t got = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, req, sizeof(req) - 1) > 0) {
      char buf[16384];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) got += static_cast<size_t>(n);
    }
  }
  close(fd);
  return got;
}

using Key = std::pair<uint32_t, uint32_t>;
struct Out {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Run {
  double secs = 0;
  double cpu = 0;
  int64_t tokens = 0;
  int64_t wal_bytes = 0;
  std::map<Key, Out> outs;
};

// One group: prompts x n samples on fresh prompts (BOS + pseudo-random ids), acknowledged after.
Run RunGroup(rollout::Client& c, int prompts, int n, int max_tokens, int vocab, int rep) {
  rollout::SubmitRequest q;
  q.group_id = static_cast<uint64_t>(rep) + 1;
  for (int p = 0; p < prompts; ++p) {
    std::vector<int32_t> ids{1};
    for (int k = 1; k < 16; ++k) {
      const uint32_t x = static_cast<uint32_t>(rep * 7919 + p * 131 + k * 17);
      ids.push_back(static_cast<int32_t>(3 + (x * 2654435761u >> 8) % (vocab - 3)));
    }
    q.prompts.push_back(std::move(ids));
  }
  q.n = static_cast<uint32_t>(n);
  q.temperature = 1.0f;
  q.top_p = 0.9f;
  q.seed = 777;
  q.max_tokens = max_tokens;
  q.stop_at_eos = false;
  Run r;
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  auto res = c.Run(q, 600000);
  r.secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu = CpuSeconds() - c0;
  if (!res.ok()) Die("run", res.status());
  std::vector<std::pair<uint32_t, uint32_t>> acks;
  for (auto& t : *res) {
    if (!t.error.ok()) Die("trajectory", t.error);
    r.tokens += static_cast<int64_t>(t.ids.size());
    r.wal_bytes += t.cost.wal_bytes;
    acks.emplace_back(t.prompt_index, t.sample_index);
    r.outs[{t.prompt_index, t.sample_index}] = {std::move(t.ids), std::move(t.logprobs)};
  }
  if (Status s = c.Ack(q.group_id, acks); !s.ok()) Die("ack", s);
  return r;
}

bool Identical(const std::map<Key, Out>& a, const std::map<Key, Out>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, x] : a) {
    auto it = b.find(k);
    if (it == b.end()) return false;
    const Out& y = it->second;
    if (x.ids.size() != y.ids.size() ||
        std::memcmp(x.ids.data(), y.ids.data(), 4 * x.ids.size()) != 0 ||
        std::memcmp(x.logprobs.data(), y.logprobs.data(), 4 * x.logprobs.size()) != 0) {
      return false;
    }
  }
  return true;
}

// The metrics' own CPU cost, measured on the calls themselves (the end-to-end A/B above is
// within the noise of a shared machine): per finished trajectory (TurnFinished +
// TrajectoryFinished), per replica heartbeat (ReplicaMetrics::Update), per coordinator
// publication and per scrape (Render of a registry with one replica), then the share of one core
// they take at `traj_per_s` trajectories/s with 10 heartbeats + 10 publications + 1 scrape a
// second.
void MetricsMicro(double traj_per_s) {
  auto m = rollout::Metrics::Start({"", true});
  if (!m.ok()) Die("metrics", m.status());
  rollout::Metrics& mt = **m;
  auto rm = mt.ForReplica("replica-0");
  auto ns_per = [](int iters, auto&& fn) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn(i);
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
  };
  Cost cost;
  cost.prefill_computed = 16;
  cost.decode_tokens = 200;
  cost.engine_seconds = 0.01;
  const double traj_ns = ns_per(1000000, [&](int) {
    mt.TurnFinished(200);
    mt.TrajectoryFinished(cost, 1);
  });
  engine::EngineStats st;
  st.kv_blocks_total = 1000;
  st.kv_block_tokens = 16;
  const double beat_ns = ns_per(100000, [&](int i) {
    st.decode_tokens += i;
    st.prefill_tokens_computed += 16;
    rm->Update(st, 512);
  });
  rollout::CoordinatorSnapshot snap;
  snap.replicas.push_back({"replica-0", true, 0, 8});
  const double pub_ns = ns_per(100000, [&](int) { mt.PublishCoordinator(snap); });
  size_t bytes = 0;
  const double render_ns = ns_per(2000, [&](int) { bytes += mt.Render().size(); });
  const double per_s = traj_per_s * traj_ns + 10 * beat_ns + 10 * pub_ns + render_ns;
  std::printf(
      "  metrics calls: %.0f ns/trajectory, %.0f ns/heartbeat, %.0f ns/publication, %.1f us/scrape "
      "(%zu bytes)\n  => %.4f%% of one core at %.0f trajectories/s, 1 scrape/s\n",
      traj_ns, beat_ns, pub_ns, render_ns / 1000, bytes / 2000, 100.0 * per_s / 1e9, traj_per_s);
}

void Bench(const std::string& name, const engine::EngineOptions& eo, int prompts, int max_tokens,
           int vocab, const Args& a) {
  std::printf("\n== %s: %d prompts x n=%d, %d tokens, 1 replica x %d thread(s), %d reps ==\n",
              name.c_str(), prompts, a.n, max_tokens, a.threads, a.reps);
  const Mode* modes = a.metrics ? kMetricsModes : kModes;
  struct Service {
    std::unique_ptr<rollout::Metrics> metrics;  // outlives the coordinator
    std::unique_ptr<rollout::Coordinator> coord;
    std::unique_ptr<rollout::Client> client;
    std::string dir;
  };
  std::vector<Service> services(kNumModes);
  for (int m = 0; m < kNumModes; ++m) {
    rollout::CoordinatorOptions co;
    co.bind = "tcp://127.0.0.1:*";
    if (modes[m].metrics) {
      auto mt = rollout::Metrics::Start({"127.0.0.1:0", true});
      if (!mt.ok()) Die("metrics", mt.status());
      services[m].metrics = std::move(mt).value();
      co.metrics = co.local_replica.metrics = services[m].metrics.get();
    }
    if (modes[m].wal) {
      services[m].dir = a.work + "/wal-" + std::to_string(getpid()) + "-" + modes[m].name;
      std::filesystem::remove_all(services[m].dir);
      co.wal.dir = services[m].dir;
      co.wal.durability = modes[m].durability;
      co.wal.commit_interval_ms = 10;
    }
    engine::EngineOptions o = eo;
    o.threads = a.threads;
    auto e = engine::OpenEngine(o);
    if (!e.ok()) Die("open " + o.model_path, e.status());
    std::vector<std::unique_ptr<engine::Engine>> engines;
    engines.push_back(std::move(e).value());
    auto coord = rollout::Coordinator::Start(co, std::move(engines));
    if (!coord.ok()) Die("coordinator", coord.status());
    rollout::ClientOptions clo;
    clo.endpoint = (*coord)->endpoint();
    auto client = rollout::Client::Connect(clo);
    if (!client.ok()) Die("client", client.status());
    services[m].coord = std::move(coord).value();
    services[m].client = std::move(client).value();
  }
  std::vector<std::vector<double>> rates(kNumModes), ratios(kNumModes), cpu_us(kNumModes);
  std::vector<int64_t> bytes(kNumModes), tokens(kNumModes);
  std::vector<double> metrics_cost[2],
      traj_per_s;  // per rep: off+metrics / off, sync+metrics / sync
  bool identical = true;
  std::atomic<bool> stop_scraper{false};
  std::atomic<int64_t> scraped{0};
  std::thread scraper([&] {
    while (!stop_scraper.load()) {
      for (const Service& s : services) {
        if (s.metrics) scraped += Scrape(s.metrics->port()) > 0 ? 1 : 0;
      }
      for (int i = 0; i < 20 && !stop_scraper.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  for (int rep = -1; rep < a.reps; ++rep) {  // rep -1 warms every service up, untimed
    std::vector<Run> runs(kNumModes);
    for (int k = 0; k < kNumModes; ++k) {
      // --metrics: odd reps run each pair the other way round (B before A), so that the
      // position within a rep (measured: +5..7% CPU for the second run) cancels out.
      const int m = a.metrics && rep % 2 != 0 ? k ^ 1 : k;
      runs[m] = RunGroup(*services[m].client, prompts, a.n, max_tokens, vocab, rep + 1);
    }
    if (rep < 0) continue;
    for (int m = 0; m < kNumModes; ++m) {
      const double rate = runs[m].tokens / std::max(runs[m].secs, 1e-9);
      rates[m].push_back(rate);
      ratios[m].push_back(rate / (runs[0].tokens / std::max(runs[0].secs, 1e-9)));
      cpu_us[m].push_back(1e6 * runs[m].cpu / std::max<int64_t>(runs[m].tokens, 1));
      bytes[m] += runs[m].wal_bytes;
      tokens[m] += runs[m].tokens;
      identical = identical && Identical(runs[m].outs, runs[0].outs);
    }
    if (a.metrics) {
      traj_per_s.push_back(a.n * prompts / std::max(runs[1].secs, 1e-9));
      metrics_cost[0].push_back(rates[1].back() / std::max(rates[0].back(), 1e-9));
      metrics_cost[1].push_back(rates[3].back() / std::max(rates[2].back(), 1e-9));
    }
  }
  stop_scraper.store(true);
  scraper.join();
  std::printf("  %-12s %12s %10s %14s %14s %12s\n", "wal", "tok/s", "vs off", "bytes/token",
              "cpu us/token", "cpu vs off");
  for (int m = 0; m < kNumModes; ++m) {
    std::printf("  %-12s %12.1f %10.3f %14.1f %14.2f %12.3f\n", modes[m].name, Median(rates[m]),
                Median(ratios[m]), static_cast<double>(bytes[m]) / std::max<int64_t>(tokens[m], 1),
                Median(cpu_us[m]), Median(cpu_us[m]) / std::max(Median(cpu_us[0]), 1e-9));
  }
  std::printf("  (medians over %d interleaved reps; 'vs off' is the median of per-rep ratios)\n",
              a.reps);
  std::printf("  every mode bit-identical to WAL off (memcmp): %s\n", identical ? "yes" : "NO");
  if (a.metrics) {
    std::printf(
        "  metrics cost (median per-rep tok/s ratio): off+metrics/off %.4f, sync+metrics/sync "
        "%.4f; cpu us/token +metrics/without: off %.4f, sync %.4f; %lld scrapes\n",
        Median(metrics_cost[0]), Median(metrics_cost[1]),
        Median(cpu_us[1]) / std::max(Median(cpu_us[0]), 1e-9),
        Median(cpu_us[3]) / std::max(Median(cpu_us[2]), 1e-9),
        static_cast<long long>(scraped.load()));
    MetricsMicro(Median(traj_per_s));
  }
  std::fflush(stdout);
  for (auto& s : services) {
    s.client.reset();
    s.coord->Stop();
    if (!s.dir.empty()) std::filesystem::remove_all(s.dir);
  }
  if (!identical) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::BenchFlags flags;
  flags.strings = {{"--models", &a.models}, {"--work", &a.work}};
  flags.ints = {{"--reps", &a.reps},
                {"--n", &a.n},
                {"--threads", &a.threads},
                {"--trajectories", &a.trajectories},
                {"--tokens", &a.tokens},
                {"--trajectories-110m", &a.trajectories_110m},
                {"--tokens-110m", &a.tokens_110m}};
  flags.switches = {{"--skip-110m", &a.skip_110m}, {"--metrics", &a.metrics}};
  if (!flags.Parse("bench_wal_service", argc, argv)) return flags.ExitStatus();
  if (a.reps < 1 || a.n < 1 || a.threads < 1 || a.trajectories < a.n || a.tokens < 1 ||
      a.trajectories_110m < a.n || a.tokens_110m < 1) {
    std::fprintf(stderr, "bench_wal_service: sizes must be positive, trajectories >= n\n");
    return 2;
  }
  std::filesystem::create_directories(a.work);
  engine::EngineOptions small;
  small.model_path = a.models + "/stories260K.bin";
  small.tokenizer_path = a.models + "/tok512.bin";
  Bench("stories260K", small, a.trajectories / a.n, a.tokens, 512, a);
  if (!a.skip_110m) {
    Result<engine::ModelShape> shape = engine::NamedShape("stories110m");
    if (!shape.ok()) Die("shape", shape.status());
    const std::string model = a.work + "/stories110m-random.bin";
    const std::string tok = a.work + "/stories110m-random.tok";
    if (!std::filesystem::exists(model) || !std::filesystem::exists(tok)) {
      std::printf("writing random-weight stories110m to %s ...\n", model.c_str());
      if (Status s = engine::WriteRandomModel(*shape, 1, model, tok); !s.ok()) Die("write", s);
    }
    engine::EngineOptions big;
    big.model_path = model;
    big.tokenizer_path = tok;
    big.kv_cache_bytes = 512ll << 20;
    Bench("stories110m (random weights)", big, a.trajectories_110m / a.n, a.tokens_110m,
          shape->vocab_size, a);
  }
  return 0;
}
