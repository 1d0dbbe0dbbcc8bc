// rollout/coordinator_state.h: the coordinator's internal state (one object, owned by the
// coordinator thread). Internal to rollout/coordinator*.cc; the public face is coordinator.h.
// Its parts own their data and are testable alone: GroupTable (group_table.h: groups, works,
// admission room, done counts, parked groups), ReplicaSet (replica_set.h), ClientOutbox
// (client_outbox.h), ConnectionAges (connection_ages.h), WeightsGate (weights_gate.h: the live
// weights, the update in flight, the version gate of queued work) and Journal
// (coordinator_journal.h: what is logged when; the WAL handle, the trajectories held until
// durable, retention and the records of the live weights). State routes messages between them;
// its methods live in five files by concern: coordinator.cc (clients, groups, dispatch, the
// loop), coordinator_replicas.cc (replica messages, drain), coordinator_weights.cc (the glue to
// the weights gate), coordinator_wal.cc (durable delivery, re-attach, Acks, recovery: the WAL's
// readers) and coordinator_tools.cc (the multi-turn tool loop).
#pragma once

#include "rollout/coordinator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "rollout/client_outbox.h"
#include "rollout/connection_ages.h"
#include "rollout/coordinator_journal.h"
#include "rollout/fair_queue.h"
#include "rollout/group_table.h"
#include "rollout/messages.h"
#include "rollout/metrics.h"
#include "rollout/rate_meter.h"
#include "rollout/replica_set.h"
#include "rollout/tool_call.h"
#include "rollout/tool_runner.h"
#include "rollout/wal_log.h"
#include "rollout/weights_gate.h"

namespace bitroll::rollout {

// Helpers of the coordinator's files (a named namespace: this header is included by several).
namespace coordinator_internal {

inline uint64_t HashBytes(const void* data, size_t n, uint64_t h = 0xCBF29CE484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

// Longest Envelope.client_id accepted.
constexpr size_t kMaxClientIdBytes = 256;

// Connections whose first-heard order the coordinator keeps before it forgets idle ones.
constexpr size_t kMaxTrackedConnections = 65536;

// The owner of the groups a client message names: its client_id when set ("c" + id), else its
// connection ("r" + routing id). docs/protocol.md "Owners".
inline std::string OwnerOf(const std::string& connection, const wire::Envelope& e) {
  if (e.client_id() != nullptr && e.client_id()->size() > 0) return "c" + e.client_id()->str();
  return "r" + connection;
}

// ReplicaRefused messages a replica connection may send before it is declared dead: a refusal
// means the replica lost requests it was sent, which a sound one never does.
constexpr uint32_t kMaxReplicaRefusals = 16;

// The largest message the coordinator accepts from a replica.
constexpr size_t kMaxReplicaMessageBytes = size_t{1} << 30;

// The largest message a replica accepts from the coordinator (replicas decode with the default
// DecodeLimits).
inline size_t ReplicaMessageLimit(const DecodeLimits& coordinator) {
  return std::min(coordinator.max_message_bytes, DecodeLimits{}.max_message_bytes);
}

}  // namespace coordinator_internal

using coordinator_internal::HashBytes;
using coordinator_internal::kMaxClientIdBytes;
using coordinator_internal::kMaxReplicaMessageBytes;
using coordinator_internal::kMaxReplicaRefusals;
using coordinator_internal::kMaxTrackedConnections;
using coordinator_internal::OwnerOf;
using coordinator_internal::ReplicaMessageLimit;

struct Coordinator::State {
  // Groups, works and parked groups: rollout/group_table.h.
  using Group = GroupEntry;
  using Work = WorkEntry;
  using Parked = ParkedGroup;
  using Replica = ReplicaEntry;  // rollout/replica_set.h

  CoordinatorOptions options;
  zmq::socket_t front;
  zmq::socket_t back;
  const std::atomic<bool>* stop = nullptr;
  // In-process replicas that said hello; Coordinator::Start waits for all of them.
  std::atomic<int> local_replicas_joined{0};

  // Groups and their works, admission room, done counts, parked groups (rollout/group_table.h).
  GroupTable table;
  FairQueue queue;      // work ids waiting for a replica (rollout/fair_queue.h)
  ReplicaSet replicas;  // rollout/replica_set.h: joins, choice, unreachable ones
  // Replies to clients (rollout/client_outbox.h): queued past ZeroMQ's high-water mark; its slow
  // and gone connections are handled between loop iterations (HandleFailures).
  ClientOutbox outbox;
  // WAL mode: the order in which connections were first heard from (rollout/connection_ages.h);
  // a prune keeps the connections that hold a group.
  ConnectionAges connections;
  // Groups re-delivering after a re-attach (keys), pumped as their client's output drains.
  std::unordered_set<std::string> redelivering;
  std::vector<uint64_t> align_buf;  // AlignForRead storage for the message being handled
  bool paused = false;              // Drain
  std::vector<std::pair<std::string, uint64_t>> drain_waiters;
  // The live weights, the update in flight and the version gate of queued work
  // (rollout/weights_gate.h); coordinator_weights.cc is the glue.
  WeightsGate weights;
  std::optional<NumericsFingerprint> fingerprint;
  uint64_t trajectories_done = 0;
  int64_t total_cached = 0, total_computed = 0;
  RateMeter rate;
  // Tool workers (rollout/tool_runner.h); created at Start.
  std::unique_ptr<ToolRunner> tools;
  int32_t eos_id = -1;
  uint64_t next_request_key = 1;  // GroupEntry::request_key of the next group
  bool recovering = false;        // RecoverFromWal runs: groups are not finished (parked) yet

  // What is logged when (rollout/coordinator_journal.h): every file reports its events there.
  // It owns the WAL handle (none without a data dir) and the trajectories held until durable.
  std::unique_ptr<Journal> journal;

  State(zmq::context_t& ctx, const CoordinatorOptions& o);  // coordinator.cc

  // The WAL (rollout/wal_log.h), for its readers: null without a data dir.
  WalLog* wal() const { return journal->log(); }

  // ---- sending ----

  void SendClient(const std::string& client, std::string_view bytes);

  // outbox's transport: one reply on the client ROUTER, never blocking.
  ClientOutbox::SendResult SendFront(const std::string& client, std::string_view bytes);

  // Sends queued replies, then re-delivers to re-attached clients with room.
  void FlushOutbox();

  void SendError(const std::string& client, uint64_t request_id, const Status& s,
                 uint64_t group_id = 0);

  void SendAck(const std::string& client, uint64_t request_id, uint64_t version);

  void SendReplica(int r, flatbuffers::FlatBufferBuilder& fbb);

  // ---- clients ----

  void OnClient(const std::string& client, const zmq::message_t& msg);

  // The live group, or (WAL) the recovered group logged without a client_id, that `owner` names
  // by `group_id`; null when none. `parked_key` (optional) gets the key of a parked one.
  Group* FindGroup(const std::string& owner, uint64_t group_id, std::string* parked_key = nullptr);

  void OnSubmit(const std::string& client, const std::string& owner, const wire::Envelope* e,
                const void* data, size_t size);

  // A group from a verified SubmitRollouts envelope `bytes`; no samples yet (GroupTable::Add).
  Group* NewGroup(const std::string& client, const std::string& owner, const std::string& key,
                  std::string_view bytes, uint64_t serial);

  // Queues sample (i, j) of g; `log` (WAL) resumes it from its logged tokens. A sample without a
  // log waits for weights version `needs_version` (a recovered group's other samples' version).
  void AddWork(Group* g, uint32_t i, uint32_t j, const wal::TrajectoryLog* log = nullptr,
               uint64_t needs_version = 0);

  void FinishGroupIfDone(Group* g);

  // Cancels every unfinished sample of `g`, then sends GroupDone.
  void AbortGroup(Group* g);

  void OnAbort(const std::string& client, const std::string& owner, uint64_t gid,
               uint64_t request_id);

  void ClientGone(const std::string& client);
  // When `client` was first heard from (WAL mode): larger is newer (connections.Seen).
  uint64_t ConnectionSeen(const std::string& client) { return connections.Seen(client); }

  void OnStatus(const std::string& client, uint64_t request_id);

  // ---- weights (rollout/weights_gate.h; the glue in coordinator_weights.cc) ----

  void OnUpdateWeights(const std::string& client, const wire::Envelope* e, const void* data,
                       size_t size);

  void SendReplicaBytes(int r, std::string_view bytes);

  // Queues `w` for dispatch (at the front: a failover), or holds it in the weights gate while
  // its needs_version is newer than the live weights.
  void Enqueue(Work* w, bool front = false);

  // Queues the held work whose weights version is now live.
  void ReleaseWaitingWork();

  void OnDrain(const std::string& client, uint64_t request_id, bool resume);

  void MaybeFinishDrain();

  // ---- replicas ----

  void OnReplica(const std::string& identity, const zmq::message_t& msg);

  void OnHello(const std::string& identity, const wire::Envelope* e);

  void ReplicaDead(int r, const char* why);

  void OnResults(int r, const wire::ReplicaResults* res);

  // The replica could not run these items (their request is unknown to it): they are queued
  // again at the front and their requests counted as not held, so they travel with them next
  // time. A replica that does this too often (kMaxReplicaRefusals) is declared dead.
  void OnRefused(int r, const wire::ReplicaRefused* m);

  // ---- requests held by replicas (replica protocol 3; coordinator.cc) ----

  // g is done: every replica that keeps its request is told to drop it.
  void ForgetRequest(Group* g);

  // Makes room on replica r for one more request of `bytes` bytes within kMaxHeldRequests /
  // kMaxHeldRequestBytes, dropping requests of which no work is in flight there (told with
  // its next ReplicaWork). False when the room cannot be made: the request goes transient.
  bool MakeRoom(int r, size_t bytes);

  // Sends a ReplicaWork holding only forget keys to each live replica that has some pending.
  void SendForgets();

  // ---- WAL (rollout/wal_log.h; what is logged when: the Journal) ----

  // The Journal's report of the WAL's sticky error (once): to every attached client with live
  // groups, and to the metrics.
  void ReportWalError(const Status& s);

  // Durable delivery, re-attach, Acks and recovery (coordinator_wal.cc).

  void Deliver(Group* g, uint32_t flat, std::string envelope, bool failed, int64_t wal_bytes);

  // A client (re)submitted the group id of a live or recovered group: it becomes the group's
  // client and gets every trajectory delivered so far and not acknowledged, then GroupDone.
  void Reattach(Group* g, const std::string& client);

  // The same for a parked group: it is brought back (its trajectories read from the WAL).
  void ReattachParked(const std::string& key, const std::string& client);

  // Re-sends the next trajectories of re-attached groups while their client's buffer has room.
  void PumpRedelivery();

  // A finished WAL group leaves memory (FinishGroupIfDone).
  void Park(Group* g);

  void OnClientAck(const std::string& client, const std::string& owner, const wire::Envelope* e);

  // Rebuilds groups and work from the WAL (Coordinator::Start, before any thread runs).
  Status RecoverFromWal();

  // ---- tool loop (coordinator_tools.cc) ----

  // A replica ended a turn of `w` (dispatched to r). Returns true when the trajectory goes on:
  // the turn ended on a tool call that is now running; false when `t` is the last turn.
  bool ContinueToolLoop(Work* w, const wire::Trajectory& t);

  // The replica reported the ids it injected for w's pending result (the turn boundary).
  void OnInjected(Work* w, const flatbuffers::Vector<int32_t>& ids);

  // Runs (or, for an unknown tool, answers at once) call `call_index` of w.
  void StartCall(Work* w, uint32_t call_index);

  // A call's result is known (run, replayed or refused): log it, queue the next turn.
  void FinishCall(Work* w, uint32_t call_index, const sandbox::RunResult* run);

  void OnToolsDone();

  // ---- dispatch ----

  void Dispatch();

  void HandleFailures();

  void CheckTimeouts();

  // Publishes queue, replica and health state to options.metrics (coordinator_metrics.cc).
  void PublishMetrics(Clock::time_point now);
  Clock::time_point metrics_published;

  // ---- loop ----

  void Run();
};

}  // namespace bitroll::rollout
