// rollout/service_test_util.h: helpers for the service tests (header-only; tests only):
//   - RunDirect: a SubmitRequest's samples run on an engine directly (no coordinator, no WAL): the
//     uninterrupted reference the crash and fault tests compare with, bit for bit;
//   - QueryWal: a running coordinator's StatusReply over a raw DEALER socket, for the WAL counters
//     and sticky error (the C++ client's StatusInfo does not carry them);
//   - SpawnQuiet: a child process (`bitroll serve`, `bitroll replica`) with stdout to /dev/null;
//   - VethNamespace: a network namespace joined to the host by a veth pair (a second "host");
//   - FreeLoopbackPort: a TCP port on 127.0.0.1 the kernel says is free, for `serve --bind`.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "engine/engine.h"
#include "rollout/client.h"
#include "rollout/protocol.h"

extern "C" char** environ;

namespace bitroll::rollout {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, closed), never
// the same twice in one process. Tests that start `bitroll serve` on a fixed endpoint (a restart
// after kill -9 must come back on the same one) use it instead of a port derived from the pid,
// which collided with other tests' ports under parallel ctest. 0 if no socket could be bound.
inline int FreeLoopbackPort() {
  static std::set<int> given;
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    close(fd);
    if (port == 0) return 0;
    if (given.insert(port).second) return port;
  }
  return 0;
}

inline std::string FreeLoopbackEndpoint() {
  return "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
}

// A network namespace `name` joined to the host by a veth pair: `name`h on the host at host_ip/24,
// `name`n inside at ns_ip/24, loopback up. Needs root; the destructor removes both.
class VethNamespace {
 public:
  VethNamespace(std::string name, std::string host_ip, std::string ns_ip)
      : name_(std::move(name)), host_ip_(std::move(host_ip)), ns_ip_(std::move(ns_ip)) {}
  VethNamespace(const VethNamespace&) = delete;
  VethNamespace& operator=(const VethNamespace&) = delete;
  ~VethNamespace() {
    Shell("ip link del " + name_ + "h");  // deletes both ends
    Shell("ip netns del " + name_);
  }
  // Empty on success, else why it could not be set up.
  std::string SetUp() {
    if (Shell("ip netns add " + name_) != 0) return "`ip netns add` is not permitted here";
    const std::vector<std::string> steps = {
        "ip link add " + name_ + "h type veth peer name " + name_ + "n",
        "ip link set " + name_ + "n netns " + name_,
        "ip addr add " + host_ip_ + "/24 dev " + name_ + "h",
        "ip link set " + name_ + "h up",
        "ip netns exec " + name_ + " ip addr add " + ns_ip_ + "/24 dev " + name_ + "n",
        "ip netns exec " + name_ + " ip link set " + name_ + "n up",
        "ip netns exec " + name_ + " ip link set lo up",
    };
    for (const auto& s : steps) {
      if (Shell(s) != 0) return "setup step failed: " + s;
    }
    return "";
  }
  const std::string& name() const { return name_; }

  // A shell command with its output discarded; its exit status (-1 if it did not exit).
  static int Shell(const std::string& cmd) {
    const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

 private:
  std::string name_, host_ip_, ns_ip_;
};

// posix_spawnp of args[0] (searched on PATH unless it has a slash) with args, stdout to /dev/null
// (stderr kept); -1 on failure.
inline pid_t SpawnQuiet(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// (prompt index, sample index) -> generated ids and logprobs.
using SampleKey = std::pair<uint32_t, uint32_t>;
struct SampleOutput {
  std::vector<int32_t> ids;
  std::vector<float> lps;
  RoutingRecord routing{};                        // when the request asked for it (MoE models)
  bool operator==(const SampleOutput& o) const {  // memcmp: ids, logprob and routing bits
    return ids.size() == o.ids.size() && lps.size() == o.lps.size() &&
           std::memcmp(ids.data(), o.ids.data(), 4 * ids.size()) == 0 &&
           std::memcmp(lps.data(), o.lps.data(), 4 * lps.size()) == 0 &&
           routing.n_layers == o.routing.n_layers && routing.k == o.routing.k &&
           routing.expert_ids == o.routing.expert_ids &&
           routing.weights.size() == o.routing.weights.size() &&
           std::memcmp(routing.weights.data(), o.routing.weights.data(),
                       4 * routing.weights.size()) == 0;
  }
};

// Every sample of `r` (prompt ids only) on `e`, stepped to completion.
inline std::map<SampleKey, SampleOutput> RunDirect(engine::Engine& e, const SubmitRequest& r) {
  uint64_t id = 1;
  std::map<uint64_t, SampleKey> keys;
  for (uint32_t p = 0; p < r.prompts.size(); ++p) {
    for (uint32_t j = 0; j < r.n; ++j) {
      engine::SequenceRequest q;
      q.id = id;
      q.prompt = r.prompts[p];
      q.sample_index = j;
      q.sampling.temperature = r.temperature;
      q.sampling.top_k = r.top_k;
      q.sampling.top_p = r.top_p;
      q.sampling.min_p = r.min_p;
      q.sampling.seed = r.seed;
      q.stop.max_tokens = r.max_tokens;
      q.stop.stop_at_eos = r.stop_at_eos;
      q.return_routing = r.return_routing;
      EXPECT_TRUE(e.Add(q).ok());
      keys[id++] = {p, j};
    }
  }
  std::map<SampleKey, SampleOutput> out;
  while (e.HasWork()) {
    auto s = e.Step();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) break;
    for (auto& f : s->finished) out[keys[f.id]] = {f.tokens, f.logprobs, f.routing};
  }
  return out;
}

struct WalStatus {
  bool replied = false;  // a StatusReply arrived
  bool ok = false;       // the WAL is enabled
  uint64_t recovered = 0, forced = 0, mismatches = 0, resumed = 0, logged = 0, bytes = 0;
  int live_replicas = 0;
  uint16_t error_code = 0;  // wire ErrorCode of the WAL's sticky error (0: none)
  std::string error_message;
};

inline WalStatus QueryWal(const std::string& endpoint, int timeout_ms = 2000) {
  WalStatus w;
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, timeout_ms);
  s.connect(endpoint);
  flatbuffers::FlatBufferBuilder fbb(64);
  auto m = wire::CreateStatus(fbb);
  FinishEnvelope(fbb, 99, wire::Message_Status, m.Union());
  s.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()), zmq::send_flags::none);
  zmq::message_t msg;
  while (s.recv(msg, zmq::recv_flags::none)) {
    std::vector<uint64_t> align;
    auto env = DecodeEnvelope(AlignForRead(msg.data(), msg.size(), &align), msg.size(), {});
    if (!env.ok() || (*env)->msg_type() != wire::Message_StatusReply) continue;
    const auto* r = (*env)->msg_as_StatusReply();
    w.replied = true;
    w.ok = r->wal_enabled();
    w.recovered = r->wal_recovered_tokens();
    w.forced = r->wal_forced_tokens();
    w.mismatches = r->wal_forced_mismatches();
    w.resumed = r->wal_resumed();
    w.logged = r->wal_tokens_logged();
    w.bytes = r->wal_bytes();
    if (const auto* reps = r->replicas()) {
      for (const auto* rep : *reps) w.live_replicas += rep->alive() ? 1 : 0;
    }
    if (const auto* e = r->wal_error()) {
      w.error_code = e->code();
      if (e->message()) w.error_message = e->message()->str();
    }
    break;
  }
  return w;
}

}  // namespace bitroll::rollout
