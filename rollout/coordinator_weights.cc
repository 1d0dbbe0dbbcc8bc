// The coordinator's glue to its weights (rollout/weights_gate.h, which owns the update in flight,
// the catch-up of late joiners and the version gate): queueing under the version gate, and the
// records of the live weights that a restart reads. schema/rollout.fbs (UpdateWeights) has the
// protocol, docs/weights.md the guide.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "rollout/coordinator_state.h"
#include "rollout/weights_registry.h"

namespace bitroll::rollout {

void Coordinator::State::OnUpdateWeights(const std::string& client, const wire::Envelope* e,
                                         const void* data, size_t size) {
  weights.OnUpdate(client, e, data, size);
  weights.MaybeSend(table.InFlight());
}

void Coordinator::State::Enqueue(Work* w, bool front) {
  table.CountQueued();
  if (!weights.Admit(w->id, w->needs_version)) return;  // RecoverFromWal logs how many wait
  queue.Push(w->group->submit->priority(), w->group->key, w->id, front);
}

void Coordinator::State::ReleaseWaitingWork() {
  const std::vector<uint64_t> runnable = weights.TakeRunnable();
  for (uint64_t id : runnable) {
    const Work* w = table.FindWork(id);
    if (w == nullptr) continue;  // aborted meanwhile (AbortGroup counted it)
    queue.Push(w->group->submit->priority(), w->group->key, id);
  }
  if (!runnable.empty()) {
    spdlog::info("coordinator: weights version={} live: {} waiting trajectories queued",
                 weights.version(), runnable.size());
  }
}

void Coordinator::State::SaveLiveWeights(const WeightsGate::Installed& w) {
  const std::filesystem::path dir(options.wal.dir);
  // Only a path can be reloaded; after streamed or NCCL weights the record says what to resend.
  const std::string body =
      nlohmann::json{{"version", w.version}, {"path", w.path}, {"source", std::string(w.source)}}
          .dump() +
      "\n";
  // Write, fsync, rename: the file is the old one or the new one, never a torn mix.
  const std::filesystem::path tmp = dir / "weights.json.tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
            ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(tmp.c_str(), (dir / "weights.json").c_str()) == 0;
  if (!ok) {
    spdlog::error(
        "coordinator: cannot record the live weights in {}: {}; after a restart the "
        "trainer must send version={} again",
        (dir / "weights.json").string(), std::strerror(errno), w.version);
  }
}

void Coordinator::State::RecordVersionInRegistry(const WeightsGate::Installed& w) {
  Status s = RecordWeightsVersion(options.wal.dir, w.version, w.source, w.path, w.weights_hash);
  if (!s.ok()) {
    spdlog::error("coordinator: weights version={} is not in the weights registry: {}", w.version,
                  s.ToString());
  }
}

void Coordinator::State::RestoreLiveWeights() {
  const std::filesystem::path file = std::filesystem::path(options.wal.dir) / "weights.json";
  std::ifstream in(file);
  if (!in) return;  // never updated
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_unsigned()) {
    spdlog::error("coordinator: {} is unreadable; ignored (the replicas serve their own weights)",
                  file.string());
    return;
  }
  const uint64_t version = j["version"].get<uint64_t>();
  const std::string path = j.value("path", std::string());
  if (!path.empty()) {
    weights.Restore(path, version, RegisteredWeightsHash(options.wal.dir, version));
    spdlog::info("coordinator: live weights version={} from {} (re-applied to every replica)",
                 version, path);
  } else {
    spdlog::warn(
        "coordinator: the live weights before the restart were version={}, sent as {}; "
        "they cannot be reloaded: trajectories logged under them wait until the trainer "
        "sends that version again",
        version, j.value("source", std::string("tensors")));
  }
}

}  // namespace bitroll::rollout
