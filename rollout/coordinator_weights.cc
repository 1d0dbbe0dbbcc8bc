// The coordinator's weight updates: from a path, streamed in parts, or broadcast over NCCL; the
// catch-up of replicas that join late. schema/rollout.fbs (UpdateWeights) has the protocol,
// docs/weights.md the guide.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "rollout/coordinator_state.h"
#include "rollout/weights_registry.h"

namespace bitroll::rollout {

namespace {

using Kind = Coordinator::State::PendingUpdate::Kind;

// A copy of `u` as the envelope a replica gets: its own request id and, for NCCL, its rank.
std::string EncodeForReplica(const wire::UpdateWeights& u, uint64_t request_id, int rank) {
  size_t bytes = 1024;
  if (u.tensors() != nullptr) {
    for (const wire::TensorFrame* f : *u.tensors())
      bytes += (f->data() ? f->data()->size() : 0) + 256;
  }
  flatbuffers::FlatBufferBuilder fbb(bytes);
  auto frames = [&](const flatbuffers::Vector<flatbuffers::Offset<wire::TensorFrame>>* v) {
    std::vector<flatbuffers::Offset<wire::TensorFrame>> out;
    if (v == nullptr) return out;
    for (const wire::TensorFrame* f : *v) {
      auto name = fbb.CreateString(f->name() ? f->name()->string_view() : std::string_view());
      auto dtype = fbb.CreateString(f->dtype() ? f->dtype()->string_view() : std::string_view());
      auto shape = f->shape() ? fbb.CreateVector(f->shape()->data(), f->shape()->size())
                              : fbb.CreateVector(std::vector<int64_t>{});
      auto data = f->data() ? fbb.CreateVector(f->data()->data(), f->data()->size())
                            : fbb.CreateVector(std::vector<uint8_t>{});
      out.push_back(wire::CreateTensorFrame(fbb, name, dtype, shape, data, f->offset()));
    }
    return out;
  };
  flatbuffers::Offset<wire::NcclWeights> nccl = 0;
  if (const wire::NcclWeights* n = u.nccl()) {
    auto id = n->unique_id() ? fbb.CreateVector(n->unique_id()->data(), n->unique_id()->size())
                             : fbb.CreateVector(std::vector<uint8_t>{});
    auto manifest = frames(n->tensors());
    nccl = wire::CreateNcclWeights(fbb, id, n->world_size(), rank, fbb.CreateVector(manifest));
  }
  auto tensors = frames(u.tensors());
  auto path = u.path() ? fbb.CreateString(u.path()->string_view()) : 0;
  auto m = wire::CreateUpdateWeights(fbb, path, u.version(), u.drain(),
                                     u.tensors() ? fbb.CreateVector(tensors) : 0, u.more(),
                                     u.full(), nccl, u.abort());
  FinishEnvelope(fbb, request_id, wire::Message_UpdateWeights, m.Union());
  return std::string(BufferView(fbb));
}

std::string EncodePath(const std::string& path, uint64_t version, uint64_t request_id) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto m = wire::CreateUpdateWeights(fbb, fbb.CreateString(path), version, false);
  FinishEnvelope(fbb, request_id, wire::Message_UpdateWeights, m.Union());
  return std::string(BufferView(fbb));
}

std::string EncodeAbort(uint64_t version) {
  flatbuffers::FlatBufferBuilder fbb(128);
  auto m = wire::CreateUpdateWeights(fbb, 0, version, false, 0, false, false, 0, /*abort=*/true);
  FinishEnvelope(fbb, 0, wire::Message_UpdateWeights, m.Union());
  return std::string(BufferView(fbb));
}

}  // namespace

void Coordinator::State::OnUpdateWeights(const std::string& client, const wire::Envelope* e,
                                         const void* data, size_t size) {
  const wire::UpdateWeights* u = e->msg_as_UpdateWeights();
  const uint64_t rid = e->request_id();
  const bool has_path = u->path() != nullptr && u->path()->size() > 0;
  const bool streamed = u->tensors() != nullptr || u->more() || u->abort();
  const bool nccl = u->nccl() != nullptr;
  if (has_path + streamed + nccl != 1) {
    return SendError(
        client, rid,
        Status::InvalidArgument(has_path + streamed + nccl == 0
                                    ? "UpdateWeights: no path, tensors or nccl source"
                                    : "UpdateWeights: give exactly one of path, tensors or nccl"));
  }
  if (update.active) {
    return SendError(client, rid,
                     Status::FailedPrecondition("another weight update is in progress"));
  }
  const bool same_stream =
      stream.active && stream.client == client && stream.version == u->version();
  if (stream.active && stream.client != client) {
    return SendError(client, rid,
                     Status::FailedPrecondition("a streamed weight update (version " +
                                                std::to_string(stream.version) +
                                                ") from another client is in progress"));
  }
  if (u->abort()) {
    if (same_stream) AbortStream("the client aborted it");
    return SendAck(client, rid, weight_version);
  }
  if (streamed) {
    const uint32_t want = same_stream ? stream.next_part : 0;
    if (u->part() != want) {
      return SendError(
          client, rid,
          Status::FailedPrecondition(
              "streamed update version " + std::to_string(u->version()) + ": part " +
              std::to_string(u->part()) + " arrived, expected part " + std::to_string(want) +
              (want == 0 ? " (no stream of this version is open: it was never started, or it was "
                           "abandoned after a failure or stream_timeout_ms; resend from part 0)"
                         : "")));
    }
  }
  if (stream.active && !same_stream) AbortStream("its client started another update");
  if (nccl) {
    const int live = replicas.Live();
    if (u->nccl()->world_size() != live + 1) {
      return SendError(
          client, rid,
          Status::FailedPrecondition(
              "nccl update: world_size is " + std::to_string(u->nccl()->world_size()) + " but " +
              std::to_string(live) + " replicas are live (world_size must be 1 + live replicas)"));
    }
  }
  update = PendingUpdate{};
  update.active = true;
  update.client = client;
  update.request_id = rid;
  update.version = u->version();
  update.drain = u->drain();
  update.full = u->full();
  update.replica_request_id = next_update_id++;
  if (has_path) {
    update.kind = Kind::kPath;
    update.path = u->path()->str();
  } else if (nccl) {
    update.kind = Kind::kNccl;
    update.message.assign(static_cast<const char*>(data), size);
  } else {
    update.kind = u->more() ? Kind::kPart : Kind::kCommit;
    update.body =
        std::make_shared<const std::string>(EncodeForReplica(*u, update.replica_request_id, 0));
    if (!stream.active) {
      stream = Stream{};
      stream.active = true;
      stream.client = client;
      stream.version = u->version();
    }
    stream.last = Clock::now();
    stream.next_part = u->part() + 1;
  }
  spdlog::info("coordinator: update weights version={} kind={} drain={}", update.version,
               update.kind == Kind::kPath     ? "path " + update.path
               : update.kind == Kind::kNccl   ? std::string("nccl")
               : update.kind == Kind::kCommit ? std::string("commit")
                                              : std::string("part"),
               update.drain);
  MaybeSendUpdate();
}

void Coordinator::State::MaybeSendUpdate() {
  if (stream.active && !update.active &&
      Clock::now() - stream.last > std::chrono::milliseconds(options.stream_timeout_ms)) {
    AbortStream("no part arrived within stream_timeout_ms");
  }
  if (!update.active || update.sent) return;
  // Parts only stage; the swap (path, commit, nccl) waits for in-flight work when draining.
  if (update.kind != Kind::kPart && update.drain && works.size() - queued > 0) return;
  update.sent = true;
  int rank = 1;
  for (int r = 0; r < static_cast<int>(replicas.size()); ++r) {
    if (!replicas[r].alive) continue;
    update.waiting.insert(r);
    switch (update.kind) {
      case Kind::kPath:
        SendReplicaBytes(r, EncodePath(update.path, update.version, update.replica_request_id));
        break;
      case Kind::kNccl: {
        auto env = DecodeEnvelope(update.message.data(), update.message.size(), options.decode);
        if (env.ok()) {
          SendReplicaBytes(r, EncodeForReplica(*(*env)->msg_as_UpdateWeights(),
                                               update.replica_request_id, rank++));
        }
        break;
      }
      case Kind::kPart:
      case Kind::kCommit:
        SendReplicaBytes(r, *update.body);
        break;
    }
  }
  if (update.kind == Kind::kPart || update.kind == Kind::kCommit) {
    stream.parts.push_back(update.body);
  }
  MaybeFinishUpdate();
}

void Coordinator::State::MaybeFinishUpdate() {
  if (!update.active || !update.sent) return;
  const bool early_error = update.kind == Kind::kNccl && !update.error.ok();
  if (!update.waiting.empty() && !early_error) return;
  // An Ack means installed: some replica that is still live acked it. None connected, or every
  // one died (silent past replica_timeout_ms, e.g. stuck in a load) before answering: an error.
  int live_installed = 0;
  for (int r : update.installed) live_installed += replicas[r].alive ? 1 : 0;
  if (update.error.ok() && live_installed == 0) {
    update.error = Status::Unavailable(
        "weights version " + std::to_string(update.version) + ": no live replica " +
        (update.kind == Kind::kPart ? "staged" : "installed") +
        " it (none is connected, or every replica died before answering); the live version "
        "stays " +
        std::to_string(weight_version));
  }
  if (!update.error.ok()) {
    SendError(update.client, update.request_id, update.error);
    if (update.kind == Kind::kPart || update.kind == Kind::kCommit) {
      AbortStream("a replica failed a part");
    }
    update = PendingUpdate{};
    return;
  }
  switch (update.kind) {
    case Kind::kPart:
      SendAck(update.client, update.request_id, weight_version);  // staged; nothing live yet
      update = PendingUpdate{};
      return;
    case Kind::kPath:
      weights_path = update.path;
      replay.clear();
      nccl_live = false;
      break;
    case Kind::kCommit: {
      if (update.full) replay.clear();
      replay.insert(replay.end(), stream.parts.begin(), stream.parts.end());
      stream = Stream{};
      nccl_live = false;
      break;
    }
    case Kind::kNccl:
      replay.clear();
      nccl_live = true;
      break;
  }
  weight_version = update.version;
  live_weights_hash = update.weights_hash;
  spdlog::info("coordinator: weights version={} live on every replica", weight_version);
  journal->OnWeightsInstalled(update.kind == Kind::kPath   ? "path"
                              : update.kind == Kind::kNccl ? "nccl"
                                                           : "tensors");
  ReleaseWaitingWork();
  SendAck(update.client, update.request_id, update.version);
  update = PendingUpdate{};
}

void Coordinator::State::Enqueue(Work* w, bool front) {
  ++queued;
  if (w->needs_version > weight_version) {  // RecoverFromWal logs how many wait
    waiting_weights.push_back(w->id);
    return;
  }
  queue.Push(w->group->submit->priority(), w->group->key, w->id, front);
}

void Coordinator::State::ReleaseWaitingWork() {
  std::vector<uint64_t> still;
  for (uint64_t id : waiting_weights) {
    auto it = works.find(id);
    if (it == works.end()) continue;  // aborted meanwhile (AbortGroup counted it)
    Work& w = it->second;
    if (w.needs_version > weight_version) {
      still.push_back(id);
      continue;
    }
    queue.Push(w.group->submit->priority(), w.group->key, id);
  }
  if (still.size() < waiting_weights.size()) {
    spdlog::info("coordinator: weights version={} live: {} waiting trajectories queued",
                 weight_version, waiting_weights.size() - still.size());
  }
  waiting_weights = std::move(still);
}

void Coordinator::State::SaveLiveWeights(const std::string& source) {
  const std::filesystem::path dir(options.wal.dir);
  // Only a path can be reloaded; after streamed or NCCL weights the record says what to resend.
  const std::string body = nlohmann::json{{"version", weight_version},
                                          {"path", source == "path" ? weights_path : ""},
                                          {"source", source}}
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
        (dir / "weights.json").string(), std::strerror(errno), weight_version);
  }
}

void Coordinator::State::RecordVersionInRegistry() {
  Status s =
      RecordWeightsVersion(options.wal.dir, weight_version,
                           update.kind == Kind::kPath   ? "path"
                           : update.kind == Kind::kNccl ? "nccl"
                                                        : "tensors",
                           update.kind == Kind::kPath ? update.path : "", update.weights_hash);
  if (!s.ok()) {
    spdlog::error("coordinator: weights version={} is not in the weights registry: {}",
                  weight_version, s.ToString());
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
    weights_path = path;
    weight_version = version;
    live_weights_hash = RegisteredWeightsHash(options.wal.dir, version);
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

void Coordinator::State::AbortStream(const char* why) {
  if (!stream.active) return;
  spdlog::warn("coordinator: streamed update version={} abandoned: {}", stream.version, why);
  const std::string bytes = EncodeAbort(stream.version);
  for (int r = 0; r < static_cast<int>(replicas.size()); ++r) {
    if (replicas[r].alive) SendReplicaBytes(r, bytes);
  }
  stream = Stream{};
}

void Coordinator::State::OnUpdateReply(int r, uint64_t request_id, Status s) {
  Replica& rep = replicas[r];
  if (rep.catchup.erase(request_id) > 0) {
    if (!s.ok()) {
      spdlog::error(
          "coordinator: replica {} cannot catch up with weights version={}: {}; "
          "nothing is dispatched to it",
          rep.name, weight_version, s.ToString());
      rep.stale = true;
    }
    return;
  }
  if (!s.ok()) {
    spdlog::error("coordinator: replica {} failed a weight update: {}", rep.name, s.ToString());
  }
  if (!update.active || !update.sent || request_id != update.replica_request_id) return;
  if (!s.ok() && update.error.ok()) update.error = s.WithContext(rep.name);
  if (s.ok() && update.kind != Kind::kPart) rep.stale = false;  // it serves the new weights
  if (s.ok()) update.installed.insert(r);
  update.waiting.erase(r);
  MaybeFinishUpdate();
}

void Coordinator::State::CatchUp(int r) {
  Replica& rep = replicas[r];
  // Messages on a replica's pipe are handled in order, so the replays come before any work.
  if (rep.weight_version != weight_version) {
    if (nccl_live) {
      spdlog::error(
          "coordinator: replica {} joined at weights version={}, but version={} came "
          "by NCCL broadcast and cannot be replayed; nothing is dispatched to it until "
          "the next update",
          rep.name, rep.weight_version, weight_version);
      rep.stale = true;
    } else {
      if (!weights_path.empty()) {
        const uint64_t id = next_update_id++;
        rep.catchup.insert(id);
        SendReplicaBytes(r, EncodePath(weights_path, weight_version, id));
      }
      for (const auto& body : replay) {
        auto env = DecodeEnvelope(body->data(), body->size(), options.decode);
        if (!env.ok()) continue;
        rep.catchup.insert((*env)->request_id());
        SendReplicaBytes(r, *body);
      }
    }
  }
  if (!update.active || !update.sent) {
    if (stream.active) {  // between two parts: stage the earlier ones too
      for (const auto& body : stream.parts) {
        auto env = DecodeEnvelope(body->data(), body->size(), options.decode);
        if (env.ok()) rep.catchup.insert((*env)->request_id());
        SendReplicaBytes(r, *body);
      }
    }
    return;
  }
  switch (update.kind) {
    case Kind::kNccl:  // the communicator's size is fixed: it cannot join
      spdlog::error(
          "coordinator: replica {} joined during an NCCL weight update; nothing is "
          "dispatched to it until the next update",
          rep.name);
      rep.stale = true;
      return;
    case Kind::kPath:
      update.waiting.insert(r);
      SendReplicaBytes(r, EncodePath(update.path, update.version, update.replica_request_id));
      return;
    case Kind::kPart:
    case Kind::kCommit:
      for (const auto& body : stream.parts) {
        if (body == update.body) continue;  // the one in flight, sent below
        auto env = DecodeEnvelope(body->data(), body->size(), options.decode);
        if (env.ok()) rep.catchup.insert((*env)->request_id());
        SendReplicaBytes(r, *body);
      }
      update.waiting.insert(r);
      SendReplicaBytes(r, *update.body);
      return;
  }
}

}  // namespace bitroll::rollout
