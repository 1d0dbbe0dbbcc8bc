// Runs rollout/python_client_test.py on /usr/bin/python3 (the Python client against
// `bitroll serve --engine null` with 1, 2, 4 replicas under load), then checks that the C++ client
// gets the very same bytes for the same group (memcmp of ids and logprob bits).
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "rollout/client.h"
#include "rollout/coordinator.h"
#include "rollout/null_engine.h"

namespace bitroll::rollout {
namespace {

bool PythonHasModules() {
  return std::system("/usr/bin/python3 -c 'import zmq, flatbuffers, numpy' >/dev/null 2>&1") == 0;
}

TEST(PythonClientTest, SameBitsAsCppClientForAnyReplicaCount) {
  if (access("/usr/bin/python3", X_OK) != 0 || !PythonHasModules()) {
    GTEST_SKIP() << "SKIPPED LOUDLY: /usr/bin/python3 with python3-zmq, python3-flatbuffers and "
                    "python3-numpy is required";
  }
  const std::string dump =
      std::string(BITROLL_BINARY_DIR) + "/python_client_test." + std::to_string(getpid()) + ".bin";
  const std::string cmd = std::string("/usr/bin/python3 ") + BITROLL_SOURCE_DIR +
                          "/rollout/python_client_test.py --bitroll " + BITROLL_EXE + " --dump " +
                          dump;
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  std::ifstream in(dump, std::ios::binary);
  const std::string py((std::istreambuf_iterator<char>(in)), {});
  std::remove(dump.c_str());
  ASSERT_FALSE(py.empty());

  // The same group through the C++ client (3 replicas: yet another count).
  CoordinatorOptions o;
  o.bind = "tcp://127.0.0.1:*";
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (int i = 0; i < 3; ++i) engines.push_back(std::make_unique<NullEngine>(NullEngineOptions{}));
  auto coord = Coordinator::Start(o, std::move(engines));
  ASSERT_TRUE(coord.ok());
  ClientOptions co;
  co.endpoint = (*coord)->endpoint();
  auto client = std::move(Client::Connect(co)).value();
  SubmitRequest q;
  q.group_id = 1;
  q.prompts = {{5, 6, 7}, {100, 200, 300, 400}, {9}};
  q.n = 8;
  q.seed = 1234;
  q.max_tokens = 40;
  q.stop_ids = {77};
  auto r = client->Run(q, 20000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::string cpp;
  for (const auto& t : *r) {
    const uint32_t head[3] = {t.prompt_index, t.sample_index, static_cast<uint32_t>(t.ids.size())};
    cpp.append(reinterpret_cast<const char*>(head), sizeof(head));
    cpp.append(reinterpret_cast<const char*>(t.ids.data()), 4 * t.ids.size());
    cpp.append(reinterpret_cast<const char*>(t.logprobs.data()), 4 * t.logprobs.size());
  }
  ASSERT_EQ(cpp.size(), py.size());
  EXPECT_EQ(std::memcmp(cpp.data(), py.data(), cpp.size()), 0);
  // Negative control: one flipped logprob bit is seen.
  std::string flipped = cpp;
  flipped[flipped.size() - 1] ^= 1;
  EXPECT_NE(std::memcmp(flipped.data(), py.data(), py.size()), 0);
}

// examples/python/stream_weights.py --self-test: the Python client streams stories260K's
// tensors into `bitroll serve` running random weights of its shape; the trajectories then equal
// (bit for bit) those of a service started on stories260K, and not before; a misnamed tensor is
// refused with a typed error and installs nothing.
TEST(PythonClientTest, StreamedWeightsEqualTheModelsOwnService) {
  if (access("/usr/bin/python3", X_OK) != 0 || !PythonHasModules()) {
    GTEST_SKIP() << "SKIPPED LOUDLY: /usr/bin/python3 with python3-zmq, python3-flatbuffers and "
                    "python3-numpy is required";
  }
  const std::string cmd = std::string("BITROLL_MODELS_DIR=") + BITROLL_MODELS_DIR +
                          " /usr/bin/python3 " + BITROLL_SOURCE_DIR +
                          "/examples/python/stream_weights.py --self-test --bitroll " + BITROLL_EXE;
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
}

}  // namespace
}  // namespace bitroll::rollout
