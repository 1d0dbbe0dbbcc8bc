// WeightsGate (rollout/weights_gate.h): the update in flight, the stream, the catch-up of late
// joiners and the version gate of queued samples.
#include "rollout/weights_gate.h"

#include <spdlog/spdlog.h>

namespace bitroll::rollout {

namespace {

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

const char* SourceOf(WeightsGate::Kind k) {
  return k == WeightsGate::Kind::kPath   ? "path"
         : k == WeightsGate::Kind::kNccl ? "nccl"
                                         : "tensors";
}

}  // namespace

WeightsGate::WeightsGate(ReplicaSet& replicas, DecodeLimits decode, int stream_timeout_ms,
                         Hooks hooks)
    : replicas_(replicas),
      decode_(decode),
      stream_timeout_ms_(stream_timeout_ms),
      hooks_(std::move(hooks)) {}

void WeightsGate::OnUpdate(const std::string& client, const wire::Envelope* e, const void* data,
                           size_t size) {
  const wire::UpdateWeights* u = e->msg_as_UpdateWeights();
  const uint64_t rid = e->request_id();
  const bool has_path = u->path() != nullptr && u->path()->size() > 0;
  const bool streamed = u->tensors() != nullptr || u->more() || u->abort();
  const bool nccl = u->nccl() != nullptr;
  if (has_path + streamed + nccl != 1) {
    return Fail(
        client, rid,
        Status::InvalidArgument(has_path + streamed + nccl == 0
                                    ? "UpdateWeights: no path, tensors or nccl source"
                                    : "UpdateWeights: give exactly one of path, tensors or nccl"));
  }
  if (update_.active) {
    return Fail(client, rid, Status::FailedPrecondition("another weight update is in progress"));
  }
  const bool same_stream =
      stream_.active && stream_.client == client && stream_.version == u->version();
  if (stream_.active && stream_.client != client) {
    return Fail(client, rid,
                Status::FailedPrecondition("a streamed weight update (version " +
                                           std::to_string(stream_.version) +
                                           ") from another client is in progress"));
  }
  if (u->abort()) {
    if (same_stream) AbortStream("the client aborted it");
    return hooks_.reply(client, rid, Status::Ok(), version_);
  }
  if (streamed) {
    const uint32_t want = same_stream ? stream_.next_part : 0;
    if (u->part() != want) {
      return Fail(
          client, rid,
          Status::FailedPrecondition(
              "streamed update version " + std::to_string(u->version()) + ": part " +
              std::to_string(u->part()) + " arrived, expected part " + std::to_string(want) +
              (want == 0 ? " (no stream of this version is open: it was never started, or it was "
                           "abandoned after a failure or stream_timeout_ms; resend from part 0)"
                         : "")));
    }
  }
  if (stream_.active && !same_stream) AbortStream("its client started another update");
  if (nccl) {
    const int live = replicas_.Live();
    if (u->nccl()->world_size() != live + 1) {
      return Fail(
          client, rid,
          Status::FailedPrecondition(
              "nccl update: world_size is " + std::to_string(u->nccl()->world_size()) + " but " +
              std::to_string(live) + " replicas are live (world_size must be 1 + live replicas)"));
    }
  }
  update_ = Pending{};
  update_.active = true;
  update_.client = client;
  update_.request_id = rid;
  update_.version = u->version();
  update_.drain = u->drain();
  update_.full = u->full();
  update_.replica_request_id = next_request_id_++;
  if (has_path) {
    update_.kind = Kind::kPath;
    update_.path = u->path()->str();
  } else if (nccl) {
    update_.kind = Kind::kNccl;
    update_.message.assign(static_cast<const char*>(data), size);
  } else {
    update_.kind = u->more() ? Kind::kPart : Kind::kCommit;
    update_.body =
        std::make_shared<const std::string>(EncodeForReplica(*u, update_.replica_request_id, 0));
    if (!stream_.active) {
      stream_ = Stream{};
      stream_.active = true;
      stream_.client = client;
      stream_.version = u->version();
    }
    stream_.last = Clock::now();
    stream_.next_part = u->part() + 1;
  }
  spdlog::info("coordinator: update weights version={} kind={} drain={}", update_.version,
               update_.kind == Kind::kPath     ? "path " + update_.path
               : update_.kind == Kind::kNccl   ? std::string("nccl")
               : update_.kind == Kind::kCommit ? std::string("commit")
                                               : std::string("part"),
               update_.drain);
}

void WeightsGate::MaybeSend(size_t in_flight) {
  if (stream_.active && !update_.active &&
      Clock::now() - stream_.last > std::chrono::milliseconds(stream_timeout_ms_)) {
    AbortStream("no part arrived within stream_timeout_ms");
  }
  if (!update_.active || update_.sent) return;
  // Parts only stage; the swap (path, commit, nccl) waits for in-flight work when draining.
  if (update_.kind != Kind::kPart && update_.drain && in_flight > 0) return;
  update_.sent = true;
  int rank = 1;
  for (int r = 0; r < replicas_.size(); ++r) {
    if (!replicas_[r].alive) continue;
    update_.waiting.insert(r);
    switch (update_.kind) {
      case Kind::kPath:
        hooks_.send_replica(r,
                            EncodePath(update_.path, update_.version, update_.replica_request_id));
        break;
      case Kind::kNccl: {
        auto env = DecodeEnvelope(update_.message.data(), update_.message.size(), decode_);
        if (env.ok()) {
          hooks_.send_replica(r, EncodeForReplica(*(*env)->msg_as_UpdateWeights(),
                                                  update_.replica_request_id, rank++));
        }
        break;
      }
      case Kind::kPart:
      case Kind::kCommit:
        hooks_.send_replica(r, *update_.body);
        break;
    }
  }
  if (update_.kind == Kind::kPart || update_.kind == Kind::kCommit) {
    stream_.parts.push_back(update_.body);
  }
  MaybeFinish();
}

void WeightsGate::MaybeFinish() {
  if (!update_.active || !update_.sent) return;
  const bool early_error = update_.kind == Kind::kNccl && !update_.error.ok();
  if (!update_.waiting.empty() && !early_error) return;
  // An Ack means installed: some replica that is still live acked it. None connected, or every
  // one died (silent past replica_timeout_ms, e.g. stuck in a load) before answering: an error.
  int live_installed = 0;
  for (int r : update_.installed) live_installed += replicas_[r].alive ? 1 : 0;
  if (update_.error.ok() && live_installed == 0) {
    update_.error = Status::Unavailable(
        "weights version " + std::to_string(update_.version) + ": no live replica " +
        (update_.kind == Kind::kPart ? "staged" : "installed") +
        " it (none is connected, or every replica died before answering); the live version "
        "stays " +
        std::to_string(version_));
  }
  if (!update_.error.ok()) {
    const Pending failed = std::move(update_);
    update_ = Pending{};
    Fail(failed.client, failed.request_id, failed.error);
    if (failed.kind == Kind::kPart || failed.kind == Kind::kCommit) {
      AbortStream("a replica failed a part");
    }
    return;
  }
  switch (update_.kind) {
    case Kind::kPart: {  // staged; nothing live yet
      const Pending staged = std::move(update_);
      update_ = Pending{};
      hooks_.reply(staged.client, staged.request_id, Status::Ok(), version_);
      return;
    }
    case Kind::kPath:
      path_ = update_.path;
      replay_.clear();
      nccl_live_ = false;
      break;
    case Kind::kCommit:
      if (update_.full) replay_.clear();
      replay_.insert(replay_.end(), stream_.parts.begin(), stream_.parts.end());
      stream_ = Stream{};
      nccl_live_ = false;
      break;
    case Kind::kNccl:
      replay_.clear();
      nccl_live_ = true;
      break;
  }
  const Pending done = std::move(update_);
  update_ = Pending{};
  version_ = done.version;
  live_weights_hash_ = done.weights_hash;
  spdlog::info("coordinator: weights version={} live on every replica", version_);
  hooks_.installed(Installed{version_, SourceOf(done.kind),
                             done.kind == Kind::kPath ? done.path : "", done.weights_hash});
  hooks_.reply(done.client, done.request_id, Status::Ok(), done.version);
}

bool WeightsGate::Admit(uint64_t work_id, uint64_t needs_version) {
  if (needs_version <= version_) return true;
  held_.emplace_back(work_id, needs_version);
  return false;
}

std::vector<uint64_t> WeightsGate::TakeRunnable() {
  std::vector<uint64_t> runnable;
  std::vector<std::pair<uint64_t, uint64_t>> still;
  for (const auto& [id, needs] : held_) {
    if (needs > version_) {
      still.emplace_back(id, needs);
    } else {
      runnable.push_back(id);
    }
  }
  held_ = std::move(still);
  return runnable;
}

void WeightsGate::Restore(const std::string& path, uint64_t version, uint64_t weights_hash) {
  path_ = path;
  version_ = version;
  live_weights_hash_ = weights_hash;
}

void WeightsGate::AbortStream(const char* why) {
  if (!stream_.active) return;
  spdlog::warn("coordinator: streamed update version={} abandoned: {}", stream_.version, why);
  const std::string bytes = EncodeAbort(stream_.version);
  for (int r = 0; r < replicas_.size(); ++r) {
    if (replicas_[r].alive) hooks_.send_replica(r, bytes);
  }
  stream_ = Stream{};
}

void WeightsGate::OnReplicaAck(int r, uint64_t request_id, uint64_t weights_hash) {
  if (request_id == update_.replica_request_id && weights_hash != 0) {
    update_.weights_hash = weights_hash;  // for the weights registry
  }
  OnReply(r, request_id, Status::Ok());
}

void WeightsGate::OnReplicaError(int r, uint64_t request_id, const Status& s) {
  OnReply(r, request_id, s);
}

void WeightsGate::OnReply(int r, uint64_t request_id, const Status& s) {
  ReplicaEntry& rep = replicas_[r];
  if (rep.catchup.erase(request_id) > 0) {
    if (!s.ok()) {
      spdlog::error(
          "coordinator: replica {} cannot catch up with weights version={}: {}; "
          "nothing is dispatched to it",
          rep.name, version_, s.ToString());
      rep.stale = true;
    }
    return;
  }
  if (!s.ok()) {
    spdlog::error("coordinator: replica {} failed a weight update: {}", rep.name, s.ToString());
  }
  if (!update_.active || !update_.sent || request_id != update_.replica_request_id) return;
  if (!s.ok() && update_.error.ok()) update_.error = s.WithContext(rep.name);
  if (s.ok() && update_.kind != Kind::kPart) rep.stale = false;  // it serves the new weights
  if (s.ok()) update_.installed.insert(r);
  update_.waiting.erase(r);
  MaybeFinish();
}

void WeightsGate::OnReplicaGone(int r) {
  if (!update_.active) return;
  update_.waiting.erase(r);
  MaybeFinish();
}

void WeightsGate::Replay(int r, const std::vector<std::shared_ptr<const std::string>>& bodies,
                         const std::shared_ptr<const std::string>& skip) {
  for (const auto& body : bodies) {
    if (body == skip) continue;
    auto env = DecodeEnvelope(body->data(), body->size(), decode_);
    if (env.ok()) replicas_[r].catchup.insert((*env)->request_id());
    hooks_.send_replica(r, *body);
  }
}

void WeightsGate::CatchUp(int r) {
  ReplicaEntry& rep = replicas_[r];
  // Messages on a replica's pipe are handled in order, so the replays come before any work.
  if (rep.weight_version != version_) {
    if (nccl_live_) {
      spdlog::error(
          "coordinator: replica {} joined at weights version={}, but version={} came "
          "by NCCL broadcast and cannot be replayed; nothing is dispatched to it until "
          "the next update",
          rep.name, rep.weight_version, version_);
      rep.stale = true;
    } else {
      if (!path_.empty()) {
        const uint64_t id = next_request_id_++;
        rep.catchup.insert(id);
        hooks_.send_replica(r, EncodePath(path_, version_, id));
      }
      for (const auto& body : replay_) {
        auto env = DecodeEnvelope(body->data(), body->size(), decode_);
        if (!env.ok()) continue;
        rep.catchup.insert((*env)->request_id());
        hooks_.send_replica(r, *body);
      }
    }
  }
  if (!update_.active || !update_.sent) {
    if (stream_.active) Replay(r, stream_.parts, nullptr);  // between two parts: stage them
    return;
  }
  switch (update_.kind) {
    case Kind::kNccl:  // the communicator's size is fixed: it cannot join
      spdlog::error(
          "coordinator: replica {} joined during an NCCL weight update; nothing is "
          "dispatched to it until the next update",
          rep.name);
      rep.stale = true;
      return;
    case Kind::kPath:
      update_.waiting.insert(r);
      hooks_.send_replica(r, EncodePath(update_.path, update_.version, update_.replica_request_id));
      return;
    case Kind::kPart:
    case Kind::kCommit:
      Replay(r, stream_.parts, update_.body);  // the one in flight is sent below
      update_.waiting.insert(r);
      hooks_.send_replica(r, *update_.body);
      return;
  }
}

}  // namespace bitroll::rollout
