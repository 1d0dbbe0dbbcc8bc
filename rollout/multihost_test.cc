// Multi-host test: a `bitroll replica` process in another network namespace connects to the
// coordinator over tcp:// through a veth pair and serves trajectories bit-identical to local ones.
//
// The test builds its own little network: namespace brt<pid>, veth pair with 10.213.7.1/24 on the
// host side and 10.213.7.2/24 inside; traffic goes only between those two addresses. Everything
// is removed afterwards, also on failure. Without permission for `ip netns` it skips loudly.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"
#include "rollout/service_test_util.h"

namespace bitroll::rollout {
namespace {

constexpr const char* kHostIp = "10.213.7.1";
constexpr const char* kNsIp = "10.213.7.2";

// Owns the namespace, the veth pair and the replica process; the destructor removes them all.
class NetNs {
 public:
  NetNs() : net_("brt" + std::to_string(getpid()), kHostIp, kNsIp) {}
  ~NetNs() {
    if (replica_ > 0) {
      kill(replica_, SIGTERM);
      int st = 0;
      for (int i = 0; i < 100 && waitpid(replica_, &st, WNOHANG) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      kill(replica_, SIGKILL);
      waitpid(replica_, &st, 0);
    }
  }
  std::string SetUp() { return net_.SetUp(); }
  bool StartReplica(const std::string& endpoint) {
    replica_ =
        SpawnQuiet({"ip", "netns", "exec", net_.name(), BITROLL_EXE, "replica", "--connect",
                    endpoint, "--engine", "null", "--name", "ns-replica", "--log-level", "warn"});
    return replica_ > 0;
  }

 private:
  VethNamespace net_;
  pid_t replica_ = -1;
};

TEST(MultiHostTest, ReplicaInOtherNetnsServesIdenticalTrajectories) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED LOUDLY: needs root for `ip netns`";
  NetNs net;
  const std::string why = net.SetUp();
  if (!why.empty()) GTEST_SKIP() << "SKIPPED LOUDLY: " << why;

  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.replica_bind = std::string("tcp://") + kHostIp + ":*";  // reachable only over the veth
  auto coord = Coordinator::Start(o, {});
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  ASSERT_EQ((*coord)->replica_endpoint().rfind(std::string("tcp://") + kHostIp + ":", 0), 0u);
  ASSERT_TRUE(net.StartReplica((*coord)->replica_endpoint()));

  // Local reference: the same group on an in-process replica.
  CoordinatorOptions lo;
  lo.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  engines.push_back(std::make_unique<NullEngine>(NullEngineOptions{}));
  auto local = Coordinator::Start(lo, std::move(engines));
  ASSERT_TRUE(local.ok());

  SubmitRequest q;
  q.group_id = 1;
  q.prompts = {{5, 6, 7}, {8, 9}};
  q.n = 6;
  q.seed = 99;
  q.max_tokens = 32;
  ClientOptions co;
  co.endpoint = (*coord)->endpoint();
  auto remote_client = std::move(Client::Connect(co)).value();
  co.endpoint = (*local)->endpoint();
  auto local_client = std::move(Client::Connect(co)).value();

  auto remote = remote_client->Run(q, 30000);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto ref = local_client->Run(q, 30000);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_EQ(remote->size(), 12u);
  ASSERT_EQ(ref->size(), 12u);
  for (size_t i = 0; i < remote->size(); ++i) {
    const auto& a = (*remote)[i];
    const auto& b = (*ref)[i];
    EXPECT_EQ(a.replica, "ns-replica");
    ASSERT_EQ(a.ids.size(), b.ids.size());
    EXPECT_EQ(std::memcmp(a.ids.data(), b.ids.data(), 4 * a.ids.size()), 0);
    EXPECT_EQ(std::memcmp(a.logprobs.data(), b.logprobs.data(), 4 * a.logprobs.size()), 0);
  }
  // Negative control: another seed changes the bits the check compares.
  SubmitRequest q2 = q;
  q2.group_id = 2;
  q2.seed = 100;
  auto other = local_client->Run(q2, 30000);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(std::memcmp((*other)[0].logprobs.data(), (*ref)[0].logprobs.data(), 4), 0);

  auto st = remote_client->GetStatus(5000);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->replicas.size(), 1u);
  EXPECT_TRUE(st->replicas[0].remote);
  EXPECT_TRUE(st->replicas[0].alive);
}

}  // namespace
}  // namespace bitroll::rollout
