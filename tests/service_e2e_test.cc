// End-to-end tests of the rollout service on the real engine (stories260K).
//
// The reference is `bitroll generate --json` run as a child process: every prompt x sample in one
// engine on this machine. The service under test is `bitroll serve --model ...` (a child process,
// 1, 2 or 4 replicas), reached through the C++ client (rollout/client.h) and the Python client
// (the package python/bitroll, via tests/service_e2e_client.py), while a second client keeps
// other groups in flight; and a `bitroll replica` in another network namespace. Every trajectory's
// ids and fp32 logprob bits must equal the reference exactly (memcmp on the bits parsed from
// generate's `logprob_bits` hex), for sampled decoding (T=1, top-p 0.9) and greedy (T=0).
// Negative controls: another seed gives other bits, and a single flipped bit is seen.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/service_test_util.h"
#include "tests/engine_test_util.h"

namespace bitroll {
namespace {

using namespace std::chrono_literals;
using rollout::Client;
using rollout::SubmitRequest;
using rollout::TrajectoryResult;

constexpr int kTimeoutMs = 60000;

std::string ModelPath() {
  return testing_util::ModelsDir() + "/stories260K.bin";
}

bool HaveModel() {
  return access(ModelPath().c_str(), R_OK) == 0;
}

// A scratch folder under the build tree, removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_(std::string(BITROLL_BINARY_DIR) + "/service_e2e." + tag + "." +
              std::to_string(getpid())) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- child processes ----

// A child process with its stdout on a pipe (stderr inherited). The destructor ends it: SIGTERM,
// then SIGKILL after 5 s.
class Child {
 public:
  static std::unique_ptr<Child> Start(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      return nullptr;
    }
    auto c = std::unique_ptr<Child>(new Child);
    c->pid_ = pid;
    c->out_ = fdopen(fds[0], "r");
    return c;
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      bool gone = false;
      for (int i = 0; i < 250 && !gone; ++i) {
        gone = waitpid(pid_, &st, WNOHANG) == pid_;
        if (!gone) std::this_thread::sleep_for(20ms);
      }
      if (!gone) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &st, 0);
      }
    }
    if (out_ != nullptr) fclose(out_);
  }
  // One line of stdout without the newline; false at end of file.
  bool ReadLine(std::string* line) {
    char* buf = nullptr;
    size_t cap = 0;
    const ssize_t n = getline(&buf, &cap, out_);
    if (n >= 0) line->assign(buf, n > 0 && buf[n - 1] == '\n' ? n - 1 : n);
    free(buf);
    return n >= 0;
  }
  // Waits for the exit; the exit status, or -1 when killed by a signal.
  int Wait() {
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

 private:
  Child() = default;
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

// ---- trajectories reduced to what the contract promises ----

struct Traj {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;  // fp32 logprob bit patterns
  std::string finish;          // "length", "eos", "stop", ...
  std::string replica;         // service only
  uint64_t weights_hash = 0;
};
using Key = std::pair<uint32_t, uint32_t>;  // (prompt_index, sample_index)
using Trajs = std::map<Key, Traj>;

bool SameBits(const Traj& a, const Traj& b) {
  return a.finish == b.finish && a.ids.size() == b.ids.size() && a.bits.size() == b.bits.size() &&
         std::memcmp(a.ids.data(), b.ids.data(), 4 * a.ids.size()) == 0 &&
         std::memcmp(a.bits.data(), b.bits.data(), 4 * a.bits.size()) == 0;
}

std::string Describe(const Traj& t) {
  std::string s = t.finish + " " + std::to_string(t.ids.size()) + " ids:";
  for (size_t i = 0; i < t.ids.size() && i < 8; ++i) s += " " + std::to_string(t.ids[i]);
  return s;
}

Traj FromClient(const TrajectoryResult& r) {
  Traj t;
  t.ids = r.ids;
  t.bits.resize(r.logprobs.size());
  std::memcpy(t.bits.data(), r.logprobs.data(), 4 * r.logprobs.size());
  std::string name = wire::EnumNameFinishReason(static_cast<wire::FinishReason>(r.finish));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  t.finish = name;
  t.replica = r.replica;
  t.weights_hash = r.fingerprint.weights_hash;
  return t;
}

// One JSON line of `bitroll generate --json` (or of the Python client's to_json()).
bool FromJson(const std::string& line, Key* key, Traj* t) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("ids") || !j.contains("logprob_bits")) return false;
  *key = {j["prompt_index"].get<uint32_t>(), j["sample_index"].get<uint32_t>()};
  t->ids = j["ids"].get<std::vector<int32_t>>();
  for (const auto& h : j["logprob_bits"]) {
    t->bits.push_back(static_cast<uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16)));
  }
  t->finish = j["finish"].get<std::string>();
  if (j.contains("fingerprint") && j["fingerprint"]["weights_hash"].is_string()) {
    t->weights_hash = std::stoull(j["fingerprint"]["weights_hash"].get<std::string>(), nullptr, 16);
  }
  return t->ids.size() == t->bits.size();
}

// ---- the groups under test ----

struct Group {
  std::vector<std::vector<int32_t>> prompts;  // ids ...
  std::vector<std::string> texts;             // ... or text (tokenized by the replica)
  uint32_t n = 1;
  float temperature = 1.0f;
  float top_p = 0.9f;
  uint64_t seed = 0;
  int32_t max_tokens = 64;

  size_t num_prompts() const { return prompts.empty() ? texts.size() : prompts.size(); }
  SubmitRequest Request(uint64_t group_id) const {
    SubmitRequest q;
    q.group_id = group_id;
    q.prompts = prompts;
    q.text_prompts = texts;
    q.n = n;
    q.temperature = temperature;
    q.top_p = top_p;
    q.seed = seed;
    q.max_tokens = max_tokens;
    return q;
  }
};

std::vector<int32_t> Encode(const std::string& text) {
  std::unique_ptr<engine::Tokenizer> tok = testing_util::Tok512();
  if (tok == nullptr) return {};
  Result<std::vector<int32_t>> ids = tok->Encode(text, /*add_bos=*/true);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// Sampled decoding on token-id prompts; one prompt is long enough to span several KV blocks.
Group SampledGroup() {
  Group g;
  g.prompts = {Encode("Once upon a time"), Encode("Tom and Lily went to the park"),
               Encode("One day, a little girl named Sue found a big red ball in the garden. She "
                      "wanted to play with it, but her mom said it was time for lunch.")};
  g.n = 4;
  g.temperature = 1.0f;
  g.top_p = 0.9f;
  g.seed = 20261129;
  g.max_tokens = 64;
  return g;
}

// Greedy decoding on text prompts (the replica tokenizes them as `bitroll generate` does).
Group GreedyGroup() {
  Group g;
  g.texts = {"The cat sat", "Once upon a time, there was a little dog"};
  g.n = 2;
  g.temperature = 0.0f;
  g.top_p = 1.0f;
  g.seed = 7;
  g.max_tokens = 64;
  return g;
}

std::string WritePrompts(const Group& g, const std::string& path) {
  std::ofstream f(path);
  if (!g.prompts.empty()) {
    for (const auto& p : g.prompts) f << nlohmann::json{{"ids", p}}.dump() << "\n";
  } else {
    for (const auto& t : g.texts) f << nlohmann::json{{"prompt", t}}.dump() << "\n";
  }
  return path;
}

std::string FloatArg(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// Runs `bitroll generate --json` on the group (seed overridable for the negative control).
void RunGenerate(const Group& g, const std::string& dir, Trajs* out) {
  const std::string prompts = WritePrompts(g, dir + "/prompts.jsonl");
  auto child = Child::Start({BITROLL_EXE, "generate", "--model", ModelPath(), "--prompts", prompts,
                             "-n", std::to_string(g.n), "--temperature", FloatArg(g.temperature),
                             "--top-p", FloatArg(g.top_p), "--seed", std::to_string(g.seed),
                             "--max-tokens", std::to_string(g.max_tokens), "--json"});
  ASSERT_NE(child, nullptr);
  std::string line;
  while (child->ReadLine(&line)) {
    Key k;
    Traj t;
    ASSERT_TRUE(FromJson(line, &k, &t)) << "bad generate line: " << line;
    (*out)[k] = std::move(t);
  }
  ASSERT_EQ(child->Wait(), 0) << "bitroll generate failed";
  ASSERT_EQ(out->size(), g.num_prompts() * g.n);
}

// `bitroll serve` on stories260K; endpoint() is the resolved client endpoint.
class Server {
 public:
  void Start(int replicas, int threads) {
    child_ = Child::Start({BITROLL_EXE, "serve", "--model", ModelPath(), "--replicas",
                           std::to_string(replicas), "--threads", std::to_string(threads), "--bind",
                           "tcp://127.0.0.1:*", "--log-level", "warn"});
    ASSERT_NE(child_, nullptr);
    std::string line;
    ASSERT_TRUE(child_->ReadLine(&line)) << "bitroll serve exited before listening";
    const std::string prefix = "bitroll serve: clients ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
    endpoint_ = line.substr(prefix.size());
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::unique_ptr<Child> child_;
  std::string endpoint_;
};

std::unique_ptr<Client> Connect(const std::string& endpoint) {
  rollout::ClientOptions co;
  co.endpoint = endpoint;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A second client that keeps other groups in flight: the test group's first prompt with other
// seeds (the prefix cache hits), a prompt sharing its prefix, and an unrelated one.
class Load {
 public:
  Load(const std::string& endpoint, const Group& base) {
    thread_ = std::thread([this, endpoint, base] {
      auto cl = Connect(endpoint);
      if (cl == nullptr) return;
      uint64_t gid = 5000;
      while (!stop_.load()) {
        SubmitRequest q;
        q.group_id = ++gid;
        std::vector<int32_t> shared = base.prompts.at(0);
        shared.insert(shared.end(), {300, 301, 302});
        q.prompts = {base.prompts.at(0), shared, {1, static_cast<int32_t>(10 + gid % 400), 42}};
        q.n = 3;
        q.temperature = gid % 2 == 0 ? 1.0f : 0.7f;
        q.top_p = 0.95f;
        q.seed = gid;
        q.max_tokens = 40;
        auto r = cl->Run(q, kTimeoutMs);
        if (r.ok() && r->size() == 9) {
          groups_.fetch_add(1);
        } else {
          errors_.fetch_add(1);
        }
      }
    });
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // Waits until at least one load group has finished (the load demonstrably runs).
  bool WaitRunning() {
    for (int i = 0; i < 3000 && groups_.load() < 1 && errors_.load() == 0; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    return groups_.load() >= 1;
  }
  int groups() const { return groups_.load(); }
  int errors() const { return errors_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> groups_{0};
  std::atomic<int> errors_{0};
  std::thread thread_;
};

void RunOnService(Client& client, const Group& g, uint64_t group_id, Trajs* out) {
  rollout::GroupSummary sum;
  auto r = client.Run(g.Request(group_id), kTimeoutMs, &sum);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), g.num_prompts() * g.n);
  EXPECT_EQ(sum.errors, 0u);
  for (const TrajectoryResult& t : *r) {
    ASSERT_TRUE(t.error.ok()) << t.error.ToString();
    (*out)[{t.prompt_index, t.sample_index}] = FromClient(t);
  }
}

// Every trajectory bit-identical to the reference; returns how many were compared.
size_t ExpectIdentical(const Trajs& got, const Trajs& ref, const std::string& what) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  size_t compared = 0;
  for (const auto& [k, t] : ref) {
    auto it = got.find(k);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": missing " << k.first << "/" << k.second;
      continue;
    }
    EXPECT_TRUE(SameBits(it->second, t))
        << what << " prompt " << k.first << " sample " << k.second << "\n  got "
        << Describe(it->second) << "\n  ref " << Describe(t);
    if (it->second.weights_hash != 0 && t.weights_hash != 0) {
      EXPECT_EQ(it->second.weights_hash, t.weights_hash) << what << ": numerics fingerprint";
    }
    ++compared;
  }
  return compared;
}

// Negative controls: the reference under another seed differs, and one flipped bit is seen.
void ExpectControlsFail(const Trajs& got, const Trajs& other_seed) {
  size_t differ = 0;
  for (const auto& [k, t] : other_seed) {
    auto it = got.find(k);
    if (it != got.end() && !SameBits(it->second, t)) ++differ;
  }
  EXPECT_GT(differ, other_seed.size() / 2) << "another seed should change most trajectories";
  ASSERT_FALSE(got.empty());
  Traj flipped = got.begin()->second;
  ASSERT_FALSE(flipped.bits.empty());
  flipped.bits.back() ^= 1u;
  EXPECT_FALSE(SameBits(flipped, got.begin()->second));
}

#define REQUIRE_E2E_PREREQS()                                                              \
  do {                                                                                     \
    if (!HaveModel()) {                                                                    \
      GTEST_SKIP() << "SKIPPED LOUDLY: " << ModelPath()                                    \
                   << " is missing (set BITROLL_MODELS_DIR to the folder of stories260K)"; \
    }                                                                                      \
  } while (0)

TEST(ServiceE2ETest, CppClientMatchesGenerateForAnyReplicaCountUnderLoad) {
  REQUIRE_E2E_PREREQS();
  ScratchDir dir("cpp");
  const Group sampled = SampledGroup();
  const Group greedy = GreedyGroup();
  ASSERT_FALSE(sampled.prompts[0].empty());
  Trajs ref_sampled, ref_greedy, ref_other_seed;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(sampled, dir.path(), &ref_sampled));
  ASSERT_NO_FATAL_FAILURE(RunGenerate(greedy, dir.path(), &ref_greedy));
  Group other = sampled;
  other.seed += 1;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(other, dir.path(), &ref_other_seed));
  // Greedy ignores the seed and the sample index: all samples of a prompt are equal.
  for (const auto& [k, t] : ref_greedy) EXPECT_TRUE(SameBits(t, ref_greedy.at({k.first, 0})));

  // (replicas, kernel threads per replica): threads never change a bit either.
  for (auto [replicas, threads] : {std::pair{1, 1}, {2, 2}, {4, 1}}) {
    SCOPED_TRACE("replicas=" + std::to_string(replicas) + " threads=" + std::to_string(threads));
    Server server;
    ASSERT_NO_FATAL_FAILURE(server.Start(replicas, threads));
    Load load(server.endpoint(), sampled);
    ASSERT_TRUE(load.WaitRunning()) << "the background load never completed a group";
    auto client = Connect(server.endpoint());
    ASSERT_NE(client, nullptr);
    Trajs got_sampled, got_greedy;
    ASSERT_NO_FATAL_FAILURE(RunOnService(*client, sampled, 1, &got_sampled));
    ASSERT_NO_FATAL_FAILURE(RunOnService(*client, greedy, 2, &got_greedy));
    load.Stop();
    EXPECT_EQ(load.errors(), 0);
    EXPECT_EQ(ExpectIdentical(got_sampled, ref_sampled, "sampled"), 12u);
    EXPECT_EQ(ExpectIdentical(got_greedy, ref_greedy, "greedy"), 4u);
    ExpectControlsFail(got_sampled, ref_other_seed);
    // The replica count is not vacuous: with several replicas, several served these groups.
    std::set<std::string> used;
    for (const Trajs* g : {&got_sampled, &got_greedy}) {
      for (const auto& [k, t] : *g) used.insert(t.replica);
    }
    EXPECT_GE(used.size(), static_cast<size_t>(std::min(replicas, 2))) << "prompts not spread";
  }
}

TEST(ServiceE2ETest, PythonClientMatchesGenerateForAnyReplicaCountUnderLoad) {
  REQUIRE_E2E_PREREQS();
  if (access("/usr/bin/python3", X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import zmq, flatbuffers, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "SKIPPED LOUDLY: /usr/bin/python3 with python3-zmq, python3-flatbuffers and "
                    "python3-numpy is required";
  }
  ScratchDir dir("py");
  const Group sampled = SampledGroup();
  const std::string prompts = WritePrompts(sampled, dir.path() + "/sampled_prompts.jsonl");
  const std::string dump = dir.path() + "/python_trajectories.jsonl";
  // The script checks every replica count against generate itself (exact hex) and dumps what the
  // Python client received; this side checks the dump against its own reference.
  auto py = Child::Start({"/usr/bin/python3",
                          std::string(BITROLL_SOURCE_DIR) + "/tests/service_e2e_client.py",
                          "--bitroll", BITROLL_EXE, "--model", ModelPath(), "--prompts", prompts,
                          "--n", std::to_string(sampled.n), "--seed", std::to_string(sampled.seed),
                          "--max-tokens", std::to_string(sampled.max_tokens), "--dump", dump});
  ASSERT_NE(py, nullptr);
  std::string line;
  while (py->ReadLine(&line)) std::printf("  [python] %s\n", line.c_str());
  ASSERT_EQ(py->Wait(), 0) << "tests/service_e2e_client.py failed (see its output above)";

  Trajs ref, got;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(sampled, dir.path(), &ref));
  std::ifstream in(dump);
  while (std::getline(in, line)) {
    Key k;
    Traj t;
    ASSERT_TRUE(FromJson(line, &k, &t)) << line;
    got[k] = std::move(t);
  }
  EXPECT_EQ(ExpectIdentical(got, ref, "python dump"), 12u);
  Group other = sampled;
  other.seed += 1;
  Trajs ref_other_seed;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(other, dir.path(), &ref_other_seed));
  ExpectControlsFail(got, ref_other_seed);
}

// ---- multi-host: a replica in another network namespace ----

constexpr const char* kHostIp = "10.213.9.1";  // rollout/multihost_test.cc uses 10.213.7.0/24
constexpr const char* kNsIp = "10.213.9.2";

// Owns the namespace, the veth pair and the replica process; the destructor removes them all.
class NetNs {
 public:
  NetNs() : net_("bre" + std::to_string(getpid()), kHostIp, kNsIp) {}
  ~NetNs() { replica_.reset(); }  // the replica first, then the namespace
  std::string SetUp() { return net_.SetUp(); }
  bool StartReplica(const std::string& endpoint) {
    replica_ = Child::Start({"ip", "netns", "exec", net_.name(), BITROLL_EXE, "replica",
                             "--connect", endpoint, "--model", ModelPath(), "--name", "ns-replica",
                             "--log-level", "warn"});
    return replica_ != nullptr;
  }

 private:
  rollout::VethNamespace net_;
  std::unique_ptr<Child> replica_;
};

TEST(ServiceE2ETest, ReplicaInOtherNetnsMatchesGenerate) {
  REQUIRE_E2E_PREREQS();
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED LOUDLY: needs root for `ip netns`";
  NetNs net;
  const std::string why = net.SetUp();
  if (!why.empty()) GTEST_SKIP() << "SKIPPED LOUDLY: " << why;

  rollout::CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.replica_bind = std::string("tcp://") + kHostIp + ":*";  // reachable only over the veth
  auto coord = rollout::Coordinator::Start(o, {});
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  ASSERT_TRUE(net.StartReplica((*coord)->replica_endpoint()));

  ScratchDir dir("netns");
  const Group sampled = SampledGroup();
  const Group greedy = GreedyGroup();
  Trajs ref_sampled, ref_greedy, ref_other_seed;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(sampled, dir.path(), &ref_sampled));
  ASSERT_NO_FATAL_FAILURE(RunGenerate(greedy, dir.path(), &ref_greedy));
  Group other = sampled;
  other.seed += 1;
  ASSERT_NO_FATAL_FAILURE(RunGenerate(other, dir.path(), &ref_other_seed));

  auto client = Connect((*coord)->endpoint());
  ASSERT_NE(client, nullptr);
  Trajs got_sampled, got_greedy;
  ASSERT_NO_FATAL_FAILURE(RunOnService(*client, sampled, 1, &got_sampled));
  ASSERT_NO_FATAL_FAILURE(RunOnService(*client, greedy, 2, &got_greedy));
  for (const auto& [k, t] : got_sampled) EXPECT_EQ(t.replica, "ns-replica");
  EXPECT_EQ(ExpectIdentical(got_sampled, ref_sampled, "remote sampled"), 12u);
  EXPECT_EQ(ExpectIdentical(got_greedy, ref_greedy, "remote greedy"), 4u);
  ExpectControlsFail(got_sampled, ref_other_seed);

  auto st = client->GetStatus(5000);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_TRUE(st->replicas[0].remote);
  EXPECT_TRUE(st->replicas[0].alive);
}

}  // namespace
}  // namespace bitroll
