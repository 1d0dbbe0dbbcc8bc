// rollout/cmd_update_weights.cc: `bitroll update-weights --connect EP --version V
//   (--path FILE | --stream FILE [--full]) [--drain] [--part-kib N] [--timeout-ms N]`
// Tells a running service to take new weights: --path makes every replica load FILE (it must be
// readable on every replica's host); --stream loads FILE here (any format the engine reads) and
// streams its tensors under the served format's names (docs/weights.md), for replicas that cannot
// read the file. Prints the live version; exit status 0, 1 on the service's typed error (printed),
// 2 on bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model_loader.h"
#include "engine/weight_update.h"
#include "rollout/client.h"
#include "rollout/commands.h"

namespace bitroll::rollout {

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: bitroll update-weights --connect tcp://HOST:PORT --version V\n"
               "         (--path FILE | --stream FILE [--full]) [--drain] [--part-kib N]\n"
               "         [--timeout-ms N]\n");
  return 2;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "bitroll update-weights: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int CmdUpdateWeights(int argc, char** argv) {
  std::string connect, path, stream;
  uint64_t version = 0;
  bool have_version = false, drain = false, full = false;
  long part_kib = 1024, timeout_ms = 600000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--connect" && has_value) {
      connect = argv[++i];
    } else if (a == "--version" && has_value) {
      char* end = nullptr;
      version = std::strtoull(argv[++i], &end, 10);
      have_version = end != nullptr && *end == '\0';
    } else if (a == "--path" && has_value) {
      path = argv[++i];
    } else if (a == "--stream" && has_value) {
      stream = argv[++i];
    } else if (a == "--part-kib" && has_value) {
      part_kib = std::atol(argv[++i]);
    } else if (a == "--timeout-ms" && has_value) {
      timeout_ms = std::atol(argv[++i]);
    } else if (a == "--drain") {
      drain = true;
    } else if (a == "--full") {
      full = true;
    } else {
      std::fprintf(stderr, "bitroll update-weights: unknown or incomplete flag %s\n", a.c_str());
      return Usage();
    }
  }
  if (connect.empty() || !have_version || path.empty() == stream.empty() || part_kib <= 0 ||
      timeout_ms <= 0) {
    return Usage();
  }
  ClientOptions co;
  co.endpoint = connect;
  auto client = Client::Connect(co);
  if (!client.ok()) return Fail(client.status());
  Result<uint64_t> live = Status::Ok();
  if (!path.empty()) {
    live = (*client)->UpdateWeights(path, version, drain, static_cast<int>(timeout_ms));
  } else {
    auto w = engine::LoadModelWeights(stream);
    if (!w.ok()) return Fail(w.status());
    std::vector<WeightTensor> tensors;
    size_t bytes = 0;
    for (const engine::NamedTensor& t : engine::TensorManifest(*w)) {
      tensors.push_back(
          {t.name, std::string(engine::DTypeName(t.tensor.dtype)), t.tensor.shape, t.tensor.data});
      bytes += static_cast<size_t>(t.tensor.size_bytes());
    }
    std::fprintf(stderr, "bitroll update-weights: streaming %zu tensors (%.1f MB) from %s\n",
                 tensors.size(), bytes / 1e6, w->source.c_str());
    live = (*client)->UpdateWeightsStreamed(tensors, version, drain, full,
                                            static_cast<int>(timeout_ms),
                                            static_cast<size_t>(part_kib) << 10);
  }
  if (!live.ok()) return Fail(live.status());
  std::printf("weights version %llu live on every replica\n",
              static_cast<unsigned long long>(*live));
  return 0;
}

}  // namespace bitroll::rollout
