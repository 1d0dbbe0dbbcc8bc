// rollout/weights_gate.h: the coordinator's weights: the live version, the one update in flight
// to the replicas (from a path, streamed in parts, or broadcast over NCCL), the catch-up of
// replicas that join late, and which queued samples may run under the live version. Owned by
// the coordinator thread; it holds no socket: it sends and answers through Hooks (the
// coordinator's sockets in the service, fakes in weights_gate_test.cc). schema/rollout.fbs
// (UpdateWeights) has the protocol, docs/weights.md the guide.
//
// Contract:
// - One update at a time: a second one, or a part of another client's stream, is refused with
//   FailedPrecondition; exactly one of path, tensors or nccl (else InvalidArgument).
// - A part only stages (its Ack carries the old live version); a path, a commit or an NCCL
//   broadcast makes the version live once every live replica answered and at least one live
//   replica installed it: then Hooks::installed runs, then the client's Ack. A failure, or no
//   live replica that installed it, answers the client with the error and leaves the live
//   version as it was (a failed part abandons its stream).
// - With drain, the swap waits until no sample is in flight (MaybeSend's `in_flight`), and
//   HoldsDispatch() is true meanwhile so that nothing new starts.
// - A stream without a part for stream_timeout_ms is abandoned (UpdateWeights.abort to every
//   live replica).
// - CatchUp brings a (re)joined replica to the live weights (path, then the committed parts in
//   order), then into the update in flight; a replica that cannot get there (NCCL weights, a
//   failed replay) is marked stale in the ReplicaSet.
// - Version gate: a sample that needs version v (a recovered one, whose logged tokens were
//   sampled under v) is held while the live version is older (Admit false) and handed back by
//   TakeRunnable once v is live.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rollout/protocol.h"
#include "rollout/rate_meter.h"
#include "rollout/replica_set.h"
#include "schema/status.h"

namespace bitroll::rollout {

class WeightsGate {
 public:
  enum class Kind { kPath, kPart, kCommit, kNccl };

  // Weights just made live, for the records a restart reads (weights.json, weights.jsonl).
  struct Installed {
    uint64_t version = 0;
    const char* source = "path";  // "path", "tensors" or "nccl"
    std::string path;             // a path update's path, else empty
    uint64_t weights_hash = 0;    // a replica's Ack (0: not reported)
  };

  struct Hooks {
    // Sends an UpdateWeights envelope to replica r.
    std::function<void(int r, std::string_view bytes)> send_replica;
    // Answers a client's UpdateWeights: an Ack carrying `version` when `s` is ok, else the error.
    std::function<void(const std::string& client, uint64_t request_id, const Status& s,
                       uint64_t version)>
        reply;
    // A version became live, before its client is answered.
    std::function<void(const Installed&)> installed;
  };

  WeightsGate(ReplicaSet& replicas, DecodeLimits decode, int stream_timeout_ms, Hooks hooks);

  // ---- the client's side ----

  // A verified UpdateWeights envelope (`data`, `size`) from `client`.
  void OnUpdate(const std::string& client, const wire::Envelope* e, const void* data, size_t size);

  // Sends the update in flight to the live replicas once its drain condition holds (`in_flight`:
  // samples dispatched and not finished); abandons a stream past stream_timeout_ms.
  void MaybeSend(size_t in_flight);

  // ---- the replicas' side ----

  // Replica r acked `request_id`, reporting `weights_hash` (0: none).
  void OnReplicaAck(int r, uint64_t request_id, uint64_t weights_hash);
  // Replica r answered `request_id` with an error.
  void OnReplicaError(int r, uint64_t request_id, const Status& s);
  // Replica r died: the update in flight no longer waits for it.
  void OnReplicaGone(int r);
  // Replica r (re)joined at ReplicaSet[r].weight_version: bring it to the live weights.
  void CatchUp(int r);

  // ---- the version gate ----

  // True when a sample needing `needs_version` may be queued now; else it is held.
  bool Admit(uint64_t work_id, uint64_t needs_version);
  // The held samples whose version is live now (some may have been aborted meanwhile).
  std::vector<uint64_t> TakeRunnable();
  const std::vector<std::pair<uint64_t, uint64_t>>& held() const { return held_; }

  // ---- state ----

  uint64_t version() const { return version_; }
  // The weights hash of the live version once an update installed it; 0: the replicas' own.
  uint64_t live_weights_hash() const { return live_weights_hash_; }
  // An update that drains is in flight (StatusReply.draining).
  bool draining() const { return update_.active && update_.drain; }
  // Nothing new is dispatched: a draining swap waits for the samples in flight.
  bool HoldsDispatch() const { return draining() && update_.kind != Kind::kPart; }
  // After a restart: the live weights came from `path` (empty: they cannot be reloaded).
  void Restore(const std::string& path, uint64_t version, uint64_t weights_hash);

 private:
  struct Pending {  // one UpdateWeights in flight to the replicas
    bool active = false;
    Kind kind = Kind::kPath;
    std::string client;
    uint64_t request_id = 0;
    std::string path;
    uint64_t version = 0;
    bool drain = false;
    bool full = false;  // a commit that names every tensor (its replay replaces the history)
    bool sent = false;
    uint64_t replica_request_id = 0;
    std::string message;                      // the client's UpdateWeights envelope (NCCL)
    std::shared_ptr<const std::string> body;  // part / commit: the envelope sent to replicas
    Status error;                             // first replica failure
    uint64_t weights_hash = 0;                // of the installed weights (a replica's Ack)
    std::unordered_set<int> waiting;          // replicas that have not answered
    std::unordered_set<int> installed;        // replicas that acked (installed / staged it)
  };
  struct Stream {  // a streamed update between its first part and its commit
    bool active = false;
    std::string client;
    uint64_t version = 0;
    Clock::time_point last;                                 // the last part's arrival
    uint32_t next_part = 0;                                 // UpdateWeights.part expected next
    std::vector<std::shared_ptr<const std::string>> parts;  // forwarded so far, in order
  };

  void OnReply(int r, uint64_t request_id, const Status& s);
  void MaybeFinish();
  void AbortStream(const char* why);
  // Sends each staged or replayed envelope to r, recording its request id as a catch-up.
  void Replay(int r, const std::vector<std::shared_ptr<const std::string>>& bodies,
              const std::shared_ptr<const std::string>& skip);
  void Fail(const std::string& client, uint64_t request_id, Status s) {
    hooks_.reply(client, request_id, s, version_);
  }

  ReplicaSet& replicas_;
  DecodeLimits decode_;
  int stream_timeout_ms_;
  Hooks hooks_;
  Pending update_;
  Stream stream_;
  uint64_t next_request_id_ = 1;
  uint64_t version_ = 0;
  uint64_t live_weights_hash_ = 0;
  std::string path_;  // current weights from a path (sent to late-joining replicas)
  // Committed streamed updates since the last path or full update, replayed (after path_) to a
  // replica that joins late; nccl_live_: the live weights came by NCCL and cannot be replayed.
  std::vector<std::shared_ptr<const std::string>> replay_;
  bool nccl_live_ = false;
  std::vector<std::pair<uint64_t, uint64_t>> held_;  // (work id, needs_version)
};

}  // namespace bitroll::rollout
