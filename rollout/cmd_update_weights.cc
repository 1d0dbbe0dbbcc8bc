// rollout/cmd_update_weights.cc: `bitroll update-weights --connect EP --version V
//   (--path FILE | --stream FILE [--full]) [--drain] [--part-kib N] [--timeout-ms N]`
// Tells a running service to take new weights: --path makes every replica load FILE (it must be
// readable on every replica's host); --stream loads FILE here (any format the engine reads) and
// streams its tensors under the served format's names (docs/weights.md), for replicas that cannot
// read the file. Prints the live version; exit status 0, 1 on the service's typed error (printed),
// 2 on bad arguments.
#include <cstdio>
#include <string>
#include <vector>

#include "engine/model_loader.h"
#include "engine/weight_update.h"
#include "rollout/cli_args.h"
#include "rollout/client.h"
#include "rollout/commands.h"
#include "rollout/progress.h"

namespace bitroll::rollout {

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "bitroll update-weights: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int CmdUpdateWeights(int argc, char** argv) {
  std::string connect, path, stream;
  uint64_t version = 0;
  bool drain = false, full = false;
  int64_t part_kib = 1024;
  int32_t timeout_ms = 600000;
  CliParser p("update-weights",
              "bitroll update-weights: give a running service new weights (docs/weights.md); "
              "prints the live version.");
  p.String("--connect", &connect, "the service's client endpoint (required)", "tcp://HOST:PORT");
  p.Integer("--version", &version, "the new weights version, in [0, 2^64 - 1] (required)", "V");
  p.String("--path", &path, "every replica loads FILE (readable on every replica's host)", "FILE");
  p.String("--stream", &stream,
           "load FILE here and stream its tensors to the replicas (any format the engine reads)",
           "FILE");
  p.Flag("--full", &full, "--stream: the replicas check that every tensor of the model was sent");
  p.Flag("--drain", &drain, "pause dispatch; work in flight finishes on the old weights first");
  p.Integer("--part-kib", &part_kib, "--stream: KiB per message part (default 1024)");
  p.Integer("--timeout-ms", &timeout_ms, "how long to wait for the service (default 600000)");
  p.Footer("Exactly one of --path and --stream. Exit status 1 on the service's typed error.");
  if (Status s = p.Parse(argc, argv); !s.ok()) return UsageError("update-weights", s);
  if (p.help()) return PrintHelp(p);
  std::string bad;
  if (connect.empty()) {
    bad = "--connect tcp://HOST:PORT is required";
  } else if (!p.Given("--version")) {
    bad = "--version V is required";
  } else if (path.empty() == stream.empty()) {
    bad = "give exactly one of --path FILE and --stream FILE";
  } else if (part_kib <= 0 || part_kib > (int64_t{1} << 30)) {
    bad = "--part-kib must be in [1, 2^30]";
  } else if (timeout_ms <= 0) {
    bad = "--timeout-ms must be > 0";
  }
  if (!bad.empty()) return UsageError("update-weights", Status::InvalidArgument(bad));
  ClientOptions co;
  co.endpoint = connect;
  auto client = Client::Connect(co);
  if (!client.ok()) return Fail(client.status());
  Result<uint64_t> live = Status::Ok();
  if (!path.empty()) {
    live = (*client)->UpdateWeights(path, version, drain, timeout_ms);
  } else {
    auto w = engine::LoadModelWeights(stream);
    if (!w.ok()) return Fail(w.status());
    std::vector<WeightTensor> tensors;
    size_t bytes = 0;
    for (const engine::NamedTensor& t : engine::TensorManifest(*w)) {
      tensors.push_back(
          {t.name, std::string(DTypeName(t.tensor.dtype)), t.tensor.shape, t.tensor.data});
      bytes += static_cast<size_t>(t.tensor.size_bytes());
    }
    std::fprintf(stderr, "bitroll update-weights: streaming %zu tensors (%.1f MB) from %s\n",
                 tensors.size(), bytes / 1e6, w->source.c_str());
    // A progress line on stderr when it is a terminal (never in pipes or tests).
    ProgressLine progress("bitroll update-weights", static_cast<int64_t>(bytes), {"MB", 1e6});
    live = (*client)->UpdateWeightsStreamed(
        tensors, version, drain, full, timeout_ms, static_cast<size_t>(part_kib) << 10,
        [&](size_t sent, size_t) { progress.Update(static_cast<int64_t>(sent)); });
    progress.Finish();
  }
  if (!live.ok()) return Fail(live.status());
  std::printf("weights version %llu live on every replica\n",
              static_cast<unsigned long long>(*live));
  return 0;
}

}  // namespace bitroll::rollout
