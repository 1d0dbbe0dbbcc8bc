// rollout/coordinator_journal.h: what the coordinator logs when, in one place.
//
// The coordinator's other files report its events to the Journal unconditionally
// (`journal->OnX(...)`); the Journal decides what goes to the write-ahead log (rollout/wal_log.h,
// records in docs/wal_format.md) and what waits for durability before it is delivered. Without a
// data directory (State::wal null) every event is a no-op and nothing is held.
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
// (State::RecoverFromWal) read and trim the log; they live in rollout/coordinator_wal.cc.
// A failed append or commit is reported once to every attached client (ReportWalError) and the
// WAL refuses new groups (Healthy).
#pragma once

#include <string>
#include <string_view>

#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

class Coordinator::State::Journal {
 public:
  explicit Journal(State& s) : s_(s) {}

  // Whether there is a log (a data directory).
  bool on() const { return s_.wal != nullptr; }

  // ---- admission ----

  // Ok, or the WAL's sticky error: no new group is accepted.
  Status Healthy() const;
  // A group of `samples` samples fits the WAL's trajectory ids.
  Status CheckGroupSize(uint64_t samples) const;
  // Logs the group's request (before anything about it is answered); `serial` gets its WAL
  // serial (0 without a WAL) and `pending` whether its group record awaits AckGroup.
  Status OnGroupAdmitted(std::string_view request, uint64_t* serial, bool* pending);

  // ---- per trajectory ----

  void OnDispatched(Work* w);
  void OnChunk(Work* w, const wire::TokenChunk& c);
  void OnTurnEnded(Work* w, const wire::Trajectory& t);
  void OnToolCallStarted(const Work& w, const ToolOutcome& o, uint32_t index);
  void OnToolCallFinished(const Work& w, const ToolOutcome& o, uint32_t index);
  void OnTurnBoundary(const Work& w, const flatbuffers::Vector<int32_t>& ids);
  // Returns true when the trajectory is held until its finish record is durable (the WAL
  // delivers it, and *envelope, the client Trajectory built with wal_bytes_slot, is moved into
  // the log's held list); false: the caller delivers *envelope now.
  bool OnTrajectoryFinished(const Work& w, const wire::Trajectory& t, std::string* envelope);
  void OnWorkAborted(const Work& w);
  void OnGroupAborted(Group* g);

  // ---- weights ----

  void OnWeightsInstalled(const WeightsGate::Installed& w);

  // ---- the loop ----

  // The poll timeout: no longer than the next group commit while trajectories are held.
  int PollWaitMs(int wait_ms) const;
  // Commits and delivers the held trajectories that are durable.
  void DeliverDurable();
  // Retention of parked groups (once a second).
  void OnHousekeeping(Clock::time_point now);

 private:
  State& s_;
};

}  // namespace bitroll::rollout
