// tests/bench/bench_coordinator.cc: load benchmark of the rollout coordinator with NullEngine
// replicas (zero delay), run by hand:
//
//   bench_coordinator [--replicas 2] [--clients 2] [--seconds 3] [--n 64] [--max-tokens 8]
//                     [--window 4] [--latency-samples 2000]
//
// Throughput: `clients` DEALERs each keep `window` groups of n samples in flight; trajectories/s
// is counted at the clients. Added latency: one client sends single-sample groups one at a time;
// the coordinator's added latency per trajectory is the round trip minus the time the same
// sample takes in a bare NullEngine (median and p99).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"

using namespace bitroll;
using namespace bitroll::rollout;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int replicas = 2, clients = 2, n = 64, max_tokens = 8, window = 4, lat_samples = 2000;
  double seconds = 3.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const char* v = argv[i + 1];
    if (f == "--replicas")
      replicas = std::atoi(v);
    else if (f == "--clients")
      clients = std::atoi(v);
    else if (f == "--seconds")
      seconds = std::atof(v);
    else if (f == "--n")
      n = std::atoi(v);
    else if (f == "--max-tokens")
      max_tokens = std::atoi(v);
    else if (f == "--window")
      window = std::atoi(v);
    else if (f == "--latency-samples")
      lat_samples = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  NullEngineOptions ne;
  ne.eos_period = 0;  // every trajectory is exactly max_tokens long
  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.local_replica.capacity = 4096;
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < replicas; ++i) engines.push_back(std::make_unique<NullEngine>(ne));
  auto coord = Coordinator::Start(o, std::move(engines));
  if (!coord.ok()) {
    std::fprintf(stderr, "%s\n", coord.status().ToString().c_str());
    return 1;
  }
  const std::string ep = (*coord)->endpoint();

  // ---- throughput ----
  std::atomic<int64_t> trajectories{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      ClientOptions co;
      co.endpoint = ep;
      auto cl = std::move(Client::Connect(co)).value();
      uint64_t gid = 1;
      int outstanding = 0;
      auto submit = [&] {
        SubmitRequest q;
        q.group_id = gid++;
        q.prompts = {{static_cast<int32_t>(3 + (c * 7 + gid) % 500), 4, 5, 6}};
        q.n = n;
        q.seed = gid;
        q.max_tokens = max_tokens;
        (void)cl->Submit(q);
        ++outstanding;
      };
      for (int w = 0; w < window; ++w) submit();
      while (outstanding > 0) {
        auto e = cl->Next(5000);
        if (!e.ok()) break;
        if (e->kind == Event::Kind::kTrajectory) trajectories.fetch_add(1);
        if (e->kind == Event::Kind::kGroupDone) {
          --outstanding;
          if (!stop.load()) submit();
        }
        if (e->kind == Event::Kind::kError) {
          std::fprintf(stderr, "error: %s\n", e->error.ToString().c_str());
          --outstanding;
        }
      }
    });
  }
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t done_at_stop = trajectories.load();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  stop.store(true);
  for (auto& t : threads) t.join();
  std::printf(
      "throughput: replicas=%d clients=%d n=%d max_tokens=%d window=%d: "
      "%.0f trajectories/s (%lld in %.2f s)\n",
      replicas, clients, n, max_tokens, window, done_at_stop / elapsed,
      static_cast<long long>(done_at_stop), elapsed);

  // ---- added latency ----
  // Bare engine time of one sample (the part the coordinator does not add).
  std::vector<double> bare;
  for (int i = 0; i < 200; ++i) {
    NullEngine e(ne);
    engine::SequenceRequest r;
    r.id = 1;
    r.prompt = {3, 4, 5, 6};
    r.stop.max_tokens = max_tokens;
    const auto s = Clock::now();
    (void)e.Add(r);
    while (e.HasWork()) (void)e.Step();
    bare.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
  }
  std::sort(bare.begin(), bare.end());
  ClientOptions co;
  co.endpoint = ep;
  auto cl = std::move(Client::Connect(co)).value();
  std::vector<double> rtt;
  for (int i = 0; i < lat_samples; ++i) {
    SubmitRequest q;
    q.group_id = 1000000 + i;
    q.prompts = {{3, 4, 5, 6}};
    q.n = 1;
    q.max_tokens = max_tokens;
    const auto s = Clock::now();
    auto r = cl->Run(q, 5000);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
    if (!r.ok()) {
      std::fprintf(stderr, "latency run failed: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (i >= 50) rtt.push_back(us);  // skip warm-up
  }
  std::sort(rtt.begin(), rtt.end());
  // Transport floor on this machine right now: a bare ZeroMQ ROUTER echo over tcp (no
  // coordinator), same message size class.
  std::vector<double> echo;
  {
    zmq::context_t ctx(1);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.bind("tcp://127.0.0.1:*");
    const std::string echo_ep = router.get(zmq::sockopt::last_endpoint);
    std::thread server([&] {
      zmq::message_t id, body;
      for (int i = 0; i < lat_samples; ++i) {
        if (!router.recv(id) || !router.recv(body)) return;
        router.send(id, zmq::send_flags::sndmore);
        router.send(body, zmq::send_flags::none);
      }
    });
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.connect(echo_ep);
    std::string payload(200, 'x');
    for (int i = 0; i < lat_samples; ++i) {
      const auto s = Clock::now();
      dealer.send(zmq::buffer(payload));
      zmq::message_t reply;
      (void)dealer.recv(reply);
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
      if (i >= 50) echo.push_back(us);
    }
    server.join();
  }
  std::sort(echo.begin(), echo.end());
  const double echo_med = echo[echo.size() / 2];
  const double bare_med = bare[bare.size() / 2];
  const double med = rtt[rtt.size() / 2], p99 = rtt[rtt.size() * 99 / 100];
  std::printf(
      "latency: single-sample round trip median %.1f us, p99 %.1f us; bare engine %.1f us;"
      " added median %.1f us, p99 %.1f us (includes GroupDone)\n",
      med, p99, bare_med, med - bare_med, p99 - bare_med);
  std::printf(
      "latency: bare ZeroMQ tcp echo median %.1f us; coordinator + replica hops add "
      "%.1f us over it. wall time per trajectory at full load (1/throughput): %.1f us\n",
      echo_med, med - bare_med - echo_med, 1e6 * elapsed / std::max<int64_t>(1, done_at_stop));
  (*coord)->Stop();
  return 0;
}
