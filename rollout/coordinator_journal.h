// rollout/coordinator_journal.h: what the coordinator logs when, in one place.
//
// The coordinator's other files report its events to the Journal unconditionally
// (`journal->OnX(...)`); the Journal decides what goes to the write-ahead log (rollout/wal_log.h,
// records in docs/wal_format.md) and what waits for durability before it is delivered. It owns
// the WAL handle, the trajectories held until durable and the records of the live weights; it
// holds no socket (delivery and error reports go through Hooks), so it is testable alone
// (coordinator_journal_test.cc). Without a data directory (no Attach) every event is a no-op and
// nothing is held.
//
// Event (Journal method) -> what is logged (WalLog) -> when the result is deliverable:
// - group admitted (OnGroupAdmitted) -> LogGroup: the SubmitRollouts envelope, before anything
//   about the group is answered -> nothing is delivered for it yet.
// - work dispatched (OnDispatched) -> on the first dispatch LogHeader (request, live weights
//   version and fingerprint); with the group's last header AckGroup; a re-dispatch logs nothing
//   (its logged tokens are forced) -> -.
// - chunk received (OnChunk) -> LogTokens: the tokens past those logged; re-scored forced tokens
//   are compared bit for bit with the log -> streamed chunks go to the client at once (not held).
// - turn ended on a tool call (OnTurnEnded) -> LogTokens: the turn's tokens not yet streamed.
// - tool call started (OnToolCallStarted) -> LogToolCall.
// - tool call finished (OnToolCallFinished) -> LogToolResult (run, replayed or refused).
// - turn boundary (OnTurnBoundary) -> LogTurnBoundary: the injected ids.
// - trajectory finished (OnTrajectoryFinished) -> LogTokens (tokens not streamed), then LogFinish
//   -> held until the finish record's LSN is durable (DeliverDurable); without a WAL at once.
// - loop pass (DeliverDurable) -> MaybeCommit (group commit) -> held trajectories whose LSN <=
//   DurableLsn() are delivered.
// - sample aborted (OnWorkAborted) -> Discard, when its header was logged.
// - group aborted (OnGroupAborted) -> AckGroup, when its group record is still pending ->
//   GroupDone at once.
// - weights installed (OnWeightsInstalled) -> <data dir>/weights.json (atomic) and weights.jsonl
//   (fsync'd) -> the client's Ack after both are written.
// - housekeeping (OnHousekeeping) -> retention: Discard of parked groups past options.retention,
//   once a second.
//
// Client Acks (State::OnClientAck: Acknowledge), re-attach and redelivery (Read) and recovery
// (State::RecoverFromWal) read and trim the log through log(); they live in
// rollout/coordinator_wal.cc. A failed append or commit is reported once (Hooks::failed: the
// coordinator tells every attached client) and the WAL refuses new groups (Healthy).
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "rollout/group_table.h"
#include "rollout/wal_log.h"
#include "rollout/weights_gate.h"

namespace bitroll::rollout {

class Journal {
 public:
  using Group = GroupEntry;
  using Work = WorkEntry;

  struct Hooks {
    // A held trajectory is durable and its group still live: count it and send it.
    std::function<void(Group* g, uint32_t flat, std::string envelope, bool failed,
                       int64_t wal_bytes)>
        deliver;
    // The WAL failed (called once, with its sticky error).
    std::function<void(const Status&)> failed;
  };
  struct Options {
    std::string dir;  // the data directory (weights.json, weights.jsonl beside the WAL)
    Clock::duration retention_max_age = std::chrono::hours(24 * 7);
    size_t retention_max_groups = 1'000'000;
  };

  // `fingerprint` is the coordinator's pinned numerics fingerprint (logged in headers).
  Journal(Options options, GroupTable& table, WeightsGate& weights,
          const std::optional<NumericsFingerprint>& fingerprint, Hooks hooks);

  // Makes the journal log to `wal` (a data directory); before that every event is a no-op.
  void Attach(std::unique_ptr<WalLog> wal) { wal_ = std::move(wal); }
  // Whether there is a log (a data directory).
  bool on() const { return wal_ != nullptr; }
  // The log, for its readers (Acks, re-attach, recovery); null without a data directory.
  WalLog* log() const { return wal_.get(); }

  // ---- admission ----

  // Ok, or the WAL's sticky error: no new group is accepted.
  Status Healthy() const;
  // A group of `samples` samples fits the WAL's trajectory ids.
  Status CheckGroupSize(uint64_t samples) const;
  // Logs the group's request (before anything about it is answered); `serial` gets its WAL
  // serial (0 without a WAL) and `pending` whether its group record awaits AckGroup.
  Status OnGroupAdmitted(std::string_view request, uint64_t* serial, bool* pending);
  // Recovery saw group serial `serial`: new groups get larger ones.
  void NoteSerial(uint64_t serial) { next_serial_ = std::max(next_serial_, serial + 1); }

  // ---- per trajectory ----

  // First dispatch logs the header; a re-dispatch (resume, failover) forces the logged tokens.
  void OnDispatched(Work* w);
  // Appends the chunk's tokens past those already logged; re-scored forced tokens are compared
  // with the log bit for bit (a mismatch is counted and reported: the numerics changed).
  void OnChunk(Work* w, const wire::TokenChunk& c);
  void OnTurnEnded(Work* w, const wire::Trajectory& t);
  void OnToolCallStarted(const Work& w, const ToolOutcome& o, uint32_t index);
  void OnToolCallFinished(const Work& w, const ToolOutcome& o, uint32_t index);
  void OnTurnBoundary(const Work& w, const flatbuffers::Vector<int32_t>& ids);
  // Returns true when the trajectory is held until its finish record is durable (the WAL
  // delivers it, and *envelope, the replica's client Trajectory (a slot for every Cost field), is
  // moved into the held list); false: the caller delivers *envelope now.
  // The turn's tokens, finish, error and routing are read from *envelope (a Trajectory envelope,
  // verified or built by the service): its ids after w's context are the last turn's.
  bool OnTrajectoryFinished(const Work& w, std::string* envelope);
  void OnWorkAborted(const Work& w);
  void OnGroupAborted(Group* g);

  // ---- weights ----

  // weights.json (atomic: what a restart re-applies) and weights.jsonl (fsync'd), before the
  // client's Ack.
  void OnWeightsInstalled(const WeightsGate::Installed& w);
  // Before recovery: a path update recorded in weights.json is live again (re-applied to the
  // replicas); streamed and NCCL weights must be sent again by the trainer.
  void RestoreLiveWeights();

  // ---- the loop ----

  // The poll timeout: no longer than the next group commit while trajectories are held.
  int PollWaitMs(int wait_ms) const;
  // Commits (group commit) and delivers the held trajectories whose finish record is durable.
  void DeliverDurable();
  // Retention of parked groups (once a second): Discard of those past the bound.
  void OnHousekeeping(Clock::time_point now);

 private:
  struct HeldDelivery {  // finished, waiting for its finish record to be durable
    uint64_t traj = 0;
    std::string group_key;
    uint32_t flat = 0;
    std::string envelope;  // client Trajectory envelope (cost.wal_bytes filled on delivery)
    bool failed = false;
    uint64_t lsn = 0;  // the finish record's LSN: delivered once DurableLsn() reaches it
  };

  void Check(const Status& s);
  void LogFinish(const Work& w, std::string envelope);
  void EnforceRetention(Clock::time_point now);

  Options options_;
  GroupTable& table_;
  WeightsGate& weights_;
  const std::optional<NumericsFingerprint>& fingerprint_;
  Hooks hooks_;
  std::unique_ptr<WalLog> wal_;    // null without a data directory
  std::deque<HeldDelivery> held_;  // in finish-append (LSN) order
  uint64_t next_serial_ = 1;
  bool error_reported_ = false;
  Clock::time_point last_retention_check_;
};

}  // namespace bitroll::rollout
