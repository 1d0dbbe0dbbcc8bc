// --metrics-bind (rollout/metrics.h) on a running coordinator, read over plain HTTP:
//   - the tokens counter moves by exactly the tokens of the trajectories the client got, the
//     trajectories counter by their number, the WAL commit histogram counts commits (data dir);
//   - /health is 200 "ready" with a live replica, 503 "no replica" without one, 503 "wal failed:"
//     once the WAL is sticky-failed (a 320 KiB tmpfs filled up, as wal_service_fault_test does),
//     503 "self-test failed:" after SetSelfTest(false, ...);
//   - bad and busy bind addresses are typed errors, not aborts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/metrics.h"
#include "rollout/null_engine.h"

namespace bitroll::rollout {
namespace {

struct HttpReply {
  int code = 0;  // 0: no reply
  std::string body;
};

// GET http://127.0.0.1:port/path with a plain socket (HTTP/1.0, the server closes).
HttpReply Get(int port, const std::string& path) {
  HttpReply r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) all.append(buf, static_cast<size_t>(n));
  close(fd);
  if (all.rfind("HTTP/1.", 0) != 0 || all.size() < 12) return r;
  r.code = std::atoi(all.c_str() + 9);
  const size_t body = all.find("\r\n\r\n");
  if (body != std::string::npos) r.body = all.substr(body + 4);
  return r;
}

// The value of the sample `series` (name with its labels, as exposed) in a /metrics text; -1
// when absent.
double Sample(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    at += series.size();
  }
  return -1;
}

// The sum of every sample of metric `name` (all label sets).
double SumOf(const std::string& text, const std::string& name) {
  double sum = 0;
  std::regex re("(^|\n)" + name + R"((\{[^}]*\})? ([0-9.eE+-]+))");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    sum += std::stod((*it)[3].str());
  }
  return sum;
}

// Polls `port`'s /metrics until pred(text) holds or 5 s passed; returns the last text.
template <typename Pred>
std::string WaitMetrics(int port, Pred pred) {
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    HttpReply r = Get(port, "/metrics");
    if (r.code == 200) text = r.body;
    if (pred(text)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return text;
}

HttpReply WaitHealth(int port, int code) {
  HttpReply r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    r = Get(port, "/health");
    if (r.code == code) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return r;
}

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "br_metrics_XXXXXX").string();
  return mkdtemp(t.data()) != nullptr ? t : "";
}

SubmitRequest Group(uint64_t gid, uint32_t n, int32_t max_tokens) {
  SubmitRequest r;
  r.group_id = gid;
  r.prompts = {{1, 5, 9}, {1, 6, 9}};
  r.n = n;
  r.temperature = 1.0f;
  r.seed = gid;
  r.max_tokens = max_tokens;
  return r;
}

struct Service {
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<Client> client;
  ~Service() {
    client.reset();
    if (coord) coord->Stop();
    coord.reset();  // before the metrics it points to
  }
};

// A coordinator with `replicas` NullEngine replicas, metrics on an ephemeral port, a client.
void StartService(Service* s, int replicas, const std::string& wal_dir, int64_t delay_us = 0,
                  uint32_t eos_period = 48) {
  auto m = Metrics::Start({"127.0.0.1:0", true});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  s->metrics = std::move(m).value();
  ASSERT_GT(s->metrics->port(), 0);
  CoordinatorOptions co;
  co.bind = "tcp://127.0.0.1:*";
  co.wal.dir = wal_dir;
  co.metrics = co.local_replica.metrics = s->metrics.get();
  std::vector<std::unique_ptr<engine::Engine>> engines;
  NullEngineOptions eo;
  eo.step_delay_us = delay_us;
  eo.eos_period = eos_period;
  for (int i = 0; i < replicas; ++i) engines.push_back(std::make_unique<NullEngine>(eo));
  auto c = Coordinator::Start(co, std::move(engines));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  s->coord = std::move(c).value();
  ClientOptions clo;
  clo.endpoint = s->coord->endpoint();
  auto client = Client::Connect(clo);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  s->client = std::move(client).value();
}

// A replica's series by layer kind follow its engine's stats: gauges take the value, counters
// move by the increase (a hybrid model's sliding-window layers; docs/design.md "KV memory per
// layer kind", "SWA prefix-cache policies").
TEST(Metrics, ReplicaSeriesByLayerKind) {
  auto m = Metrics::Start({});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::unique_ptr<ReplicaMetrics> r = (*m)->ForReplica("r0");
  engine::EngineStats s;
  s.kv_bytes_per_token_full = 512;
  s.kv_bytes_per_token_sliding = 2560;
  s.kv_live_bytes_full = 1 << 20;
  s.kv_live_bytes_sliding = 3 << 20;
  s.prefix_cached_bytes_full = 4096;
  s.prefix_cached_bytes_sliding = 8192;
  s.disk_bytes_full = 100;
  s.disk_bytes_sliding = 200;
  s.swa_rebuilds = 2;
  s.swa_recomputed_tokens = 600;
  r->Update(s, 1024);
  s.swa_rebuilds = 3;
  s.swa_recomputed_tokens = 900;
  s.kv_live_bytes_sliding = 1 << 20;
  r->Update(s, 1024);
  const std::string t = (*m)->Render();
  auto at = [&](const std::string& name, const char* kind) {
    return Sample(t, name + "{kind=\"" + kind + "\",replica=\"r0\"}");
  };
  EXPECT_EQ(at("bitroll_kv_bytes_per_token", "full"), 512);
  EXPECT_EQ(at("bitroll_kv_bytes_per_token", "sliding"), 2560);
  EXPECT_EQ(at("bitroll_kv_live_bytes", "full"), 1 << 20);
  EXPECT_EQ(at("bitroll_kv_live_bytes", "sliding"), 1 << 20);  // the latest value
  EXPECT_EQ(at("bitroll_prefix_cached_bytes", "sliding"), 8192);
  EXPECT_EQ(at("bitroll_kv_disk_bytes", "full"), 100);
  EXPECT_EQ(Sample(t, R"(bitroll_swa_rebuilds_total{replica="r0"})"), 3);
  EXPECT_EQ(Sample(t, R"(bitroll_swa_recomputed_tokens_total{replica="r0"})"), 900);
}

TEST(Metrics, BindErrorsAreTyped) {
  auto bad = Metrics::Start({"no-port", true});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument) << bad.status().ToString();
  auto first = Metrics::Start({"127.0.0.1:0", true});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto busy = Metrics::Start({"127.0.0.1:" + std::to_string((*first)->port()), true});
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), ErrorCode::kUnavailable) << busy.status().ToString();
  auto off = Metrics::Start({"", true});  // no server: counted, rendered, no port
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->port(), 0);
  EXPECT_NE((*off)->Render().find("bitroll_tokens_generated_total"), std::string::npos);
}

TEST(Metrics, HealthReasons) {
  auto m = Metrics::Start({"127.0.0.1:0", true});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Metrics& mm = **m;
  HttpReply r = Get(mm.port(), "/health");
  EXPECT_EQ(r.code, 503);
  EXPECT_EQ(r.body, "not ready: no replica\n");
  CoordinatorSnapshot snap;
  snap.replicas.push_back({"r0", true, 3, 0});
  mm.PublishCoordinator(snap);
  r = Get(mm.port(), "/health");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, "ready\n");
  mm.SetSelfTest(false, "batch of 3 differs at token 7");
  r = Get(mm.port(), "/health");
  EXPECT_EQ(r.code, 503);
  EXPECT_EQ(r.body, "not ready: self-test failed: batch of 3 differs at token 7\n");
  mm.SetSelfTest(true);
  EXPECT_EQ(Get(mm.port(), "/health").code, 200);
  EXPECT_EQ(Get(mm.port(), "/nothing").code, 404);
  const std::string text = Get(mm.port(), "/metrics").body;
  EXPECT_EQ(Sample(text, R"(bitroll_replica_weights_version{replica="r0"})"), 3) << text;
  EXPECT_EQ(Sample(text, "bitroll_ready"), 1) << text;
  // `bitroll replica` mode: no replica requirement.
  auto rm = Metrics::Start({"127.0.0.1:0", false});
  ASSERT_TRUE(rm.ok());
  EXPECT_EQ(Get((*rm)->port(), "/health").code, 200);
}

TEST(MetricsService, TokensTrajectoriesAndWalCommits) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  {
    Service s;
    ASSERT_NO_FATAL_FAILURE(StartService(&s, 2, dir + "/wal"));
    const int port = s.metrics->port();
    EXPECT_EQ(WaitHealth(port, 200).body, "ready\n");
    double before = 0;
    uint64_t trajectories = 0;
    for (uint64_t gid = 1; gid <= 2; ++gid) {
      auto res = s.client->Run(Group(gid, 4, 64), 30000);
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      ASSERT_EQ(res->size(), 8u);
      uint64_t tokens = 0;
      for (const auto& t : *res) tokens += t.ids.size();
      ASSERT_GT(tokens, 0u);
      trajectories += res->size();
      // Exactly the tokens delivered: the counter is updated before the delivery.
      const std::string text = Get(port, "/metrics").body;
      const double now = Sample(text, "bitroll_tokens_generated_total");
      EXPECT_EQ(now - before, static_cast<double>(tokens)) << "group " << gid << "\n" << text;
      EXPECT_EQ(SumOf(text, "bitroll_trajectories_finished_total"),
                static_cast<double>(trajectories));
      EXPECT_GT(Sample(text, "bitroll_wal_commit_seconds_count"), 0) << text;
      EXPECT_GT(Sample(text, "bitroll_wal_bytes_total"), 0) << text;
      before = now;
    }
    // Heartbeat- and loop-published series.
    const std::string text = WaitMetrics(port, [](const std::string& t) {
      return SumOf(t, "bitroll_decode_tokens_total") > 0 &&
             Sample(t, R"(bitroll_replica_alive{replica="replica-1"})") == 1;
    });
    EXPECT_GT(SumOf(text, "bitroll_decode_tokens_total"), 0) << text;
    // The NullEngine has no KV cache: the series is there, at 0 (tests/ops has the real model).
    EXPECT_EQ(Sample(text, R"(bitroll_kv_capacity_tokens{replica="replica-0"})"), 0) << text;
    EXPECT_EQ(Sample(text, "bitroll_replicas_alive"), 2) << text;
    EXPECT_EQ(Sample(text, "bitroll_queue_waiting_samples"), 0) << text;
    EXPECT_EQ(Get(port, "/health").code, 200);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(MetricsService, NoReplicaIsNotReady) {
  Service s;
  ASSERT_NO_FATAL_FAILURE(StartService(&s, 0, ""));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few loop publications
  const HttpReply r = Get(s.metrics->port(), "/health");
  EXPECT_EQ(r.code, 503);
  EXPECT_EQ(r.body, "not ready: no replica\n");
}

TEST(MetricsService, FailedWalIsNotReady) {
  const std::string root = TempDir();
  ASSERT_FALSE(root.empty());
  const std::string mnt = root + "/mnt";
  std::filesystem::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=320k") != 0) {
    std::filesystem::remove_all(root);
    GTEST_SKIP() << "SKIPPED LOUDLY: cannot mount a 320 KiB tmpfs (" << std::strerror(errno)
                 << "); the failed-WAL health check needs CAP_SYS_ADMIN (root)";
  }
  {
    Service s;
    ASSERT_NO_FATAL_FAILURE(StartService(&s, 2, mnt + "/wal", 1000, 400));
    const int port = s.metrics->port();
    EXPECT_EQ(WaitHealth(port, 200).code, 200);
    SubmitRequest big = Group(7, 16, 2000);  // ~32 x 400 tokens: more than 320 KiB of WAL
    auto res = s.client->Run(big, 60000);
    EXPECT_FALSE(res.ok()) << "the group fit in 320 KiB; the test needs a bigger rollout";
    const HttpReply r = WaitHealth(port, 503);
    EXPECT_EQ(r.code, 503);
    EXPECT_EQ(r.body.rfind("not ready: wal failed: ", 0), 0u) << r.body;
    EXPECT_EQ(Sample(Get(port, "/metrics").body, "bitroll_wal_failed"), 1);
  }
  umount2(mnt.c_str(), MNT_DETACH);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

}  // namespace
}  // namespace bitroll::rollout
