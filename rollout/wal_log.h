// rollout/wal_log.h: the coordinator's side of the token-level WAL (wal/wal.h): trajectory ids,
// what is logged when, group commit driven by the coordinator loop, and rebuilding client
// Trajectory envelopes from logged records after a restart. docs/protocol.md ("Recovery") and
// docs/wal_format.md ("The rollout service") describe the behaviour.
//
// What the coordinator logs (WalServiceOptions::dir set, `bitroll serve --data-dir DIR`):
//   accepted group   -> AppendGroup(serial, SubmitRollouts envelope)
//   first dispatch   -> AppendHeader(traj): request bytes, seed, sampling, weight version,
//                       numerics fingerprint; AcknowledgeGroup once every sample has a header
//   TokenChunk       -> AppendTokens(traj): every generated token (id, logprob, version), in order
//   tool loop        -> AppendToolCall before a call runs, AppendToolResult once it returned,
//                       AppendTurnBoundary (the injected result ids) when the next turn starts;
//                       token indexes count sampled tokens only (rollout/coordinator_tools.cc)
//   replica finish   -> AppendFinish(traj); the client gets the trajectory only once
//                       IsTrajectoryDurable(traj)
//   client Ack       -> Acknowledge(traj): compaction (a delivered trajectory of the Ack's owner)
//   retention        -> Discard(traj): a finished group not acknowledged in time
// Commits happen only between two passes of the coordinator loop (WalOptions::background_commit
// = false), so the tokens and the finish record of one ReplicaResults message land in the same
// LMDB transaction: a trajectory whose logged tokens are complete always has its finish record.
//
// Trajectory ids: (group serial << kWalSampleBits) | flat sample index, where the serial is the
// coordinator's own counter (never a client's group id) and flat = prompt_index * n + sample.
// The same id is the work id sent to replicas.
//
// Thread-safety: a WalLog is used by the coordinator thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "rollout/messages.h"
#include "rollout/protocol.h"
#include "rollout/tool_call.h"
#include "schema/status.h"
#include "wal/wal.h"

namespace bitroll::rollout {

class Metrics;  // rollout/metrics.h

struct WalServiceOptions {
  // Data directory of the WAL (one LMDB environment). Empty = no WAL (the service as before).
  std::string dir;
  // kSyncEveryCommit: fsync per commit, nothing acknowledged is ever lost. kWindow: power loss
  // may lose the last sync_window_ms (kill -9 loses nothing committed). kNone: benchmarks.
  wal::Durability durability = wal::Durability::kSyncEveryCommit;
  // Group commit: the coordinator loop commits buffered records at most this often. Larger =
  // fewer fsyncs per token, later delivery of finished trajectories.
  int commit_interval_ms = 10;
  // kWindow only: the longest a committed record waits for its sync.
  int sync_window_ms = 100;
};

constexpr int kWalSampleBits = 24;
constexpr uint32_t kWalMaxSamples = 1u << kWalSampleBits;  // samples per group in WAL mode
inline uint64_t WalTrajId(uint64_t serial, uint32_t flat) {
  return (serial << kWalSampleBits) | flat;
}
inline uint64_t WalSerialOf(uint64_t traj) {
  return traj >> kWalSampleBits;
}
inline uint32_t WalFlatOf(uint64_t traj) {
  return static_cast<uint32_t>(traj & (kWalMaxSamples - 1));
}

// Counters since this process opened the WAL (exposed in StatusReply).
struct WalCounters {
  uint64_t tokens_logged = 0;      // generated tokens appended
  uint64_t recovered_tokens = 0;   // logged tokens of the unfinished trajectories Recover() found
  uint64_t forced_tokens = 0;      // logged tokens re-dispatched as forced (resume, failover)
  uint64_t resumed = 0;            // trajectories re-dispatched with forced tokens
  uint64_t forced_mismatches = 0;  // a re-scored forced token (id or logprob bits) != the log
};

class WalLog {
 public:
  // Opens the WAL in options.dir. Errors: those of wal::Wal::Open.
  static Result<std::unique_ptr<WalLog>> Open(const WalServiceOptions& options);

  // REQUIRES: called once, before any Log*.
  Result<wal::RecoveryResult> Recover() { return wal_->Recover(); }

  Status LogGroup(uint64_t serial, std::string_view request) {
    return wal_->AppendGroup(serial, request);
  }
  Status AckGroup(uint64_t serial) { return wal_->AcknowledgeGroup(serial); }
  // The header of sample `sample_index` of `m` (whose envelope bytes are `request`).
  Status LogHeader(uint64_t traj, uint64_t serial, uint32_t sample_index,
                   const wire::SubmitRollouts& m, std::string_view request, uint64_t weight_version,
                   const NumericsFingerprint& fp);
  Status LogTokens(uint64_t traj, std::span<const int32_t> ids, std::span<const float> lps,
                   uint64_t weight_version);
  Status LogFinish(uint64_t traj, wire::FinishReason reason, std::string_view error,
                   const RoutingRecord* routing = nullptr) {
    return wal_->AppendFinish(traj, FinishFromWire(reason), error, routing);
  }
  Status LogToolCall(uint64_t traj, const wal::ToolCall& c) {
    return wal_->AppendToolCall(traj, c);
  }
  Status LogToolResult(uint64_t traj, const wal::ToolResult& r) {
    return wal_->AppendToolResult(traj, r);
  }
  Status LogTurnBoundary(uint64_t traj, const wal::TurnBoundary& b) {
    return wal_->AppendTurnBoundary(traj, b);
  }
  Status Acknowledge(uint64_t traj) { return wal_->Acknowledge(traj); }
  Status Discard(uint64_t traj) { return wal_->Discard(traj); }

  // Commits what is buffered when commit_interval_ms have passed since the last commit (always
  // when `force`). Call between loop passes only. Returns the (sticky) error of a failed commit.
  Status MaybeCommit(bool force = false);
  // Milliseconds until the next commit is due (for the loop's poll timeout).
  int MsUntilCommit() const;

  bool Durable(uint64_t traj) const { return wal_->IsTrajectoryDurable(traj); }
  // Every change (append, acknowledgement, discard) gets an LSN; those <= DurableLsn() are
  // durable.
  uint64_t LastLsn() const { return wal_->LastLsn(); }
  uint64_t DurableLsn() const { return wal_->DurableLsn(); }
  // False once a trajectory is acknowledged or discarded (even before that is committed).
  bool Known(uint64_t traj) const { return wal_->NextSeq(traj) > 0; }
  // A trajectory's committed records (kNotFound once acknowledged or discarded).
  Result<wal::TrajectoryLog> Read(uint64_t traj) const { return wal_->ReadTrajectory(traj); }
  uint64_t Bytes(uint64_t traj) const { return wal_->TrajectoryBytes(traj); }
  Status status() const { return wal_->status(); }
  wal::WalStats stats() const { return wal_->stats(); }

  WalCounters counters;
  // Commit latency and bytes go here (rollout/metrics.h); null: none. Not owned.
  Metrics* metrics = nullptr;

 private:
  WalLog(const WalServiceOptions& options, std::unique_ptr<wal::Wal> w)
      : options_(options), wal_(std::move(w)) {}

  WalServiceOptions options_;
  std::unique_ptr<wal::Wal> wal_;
  uint64_t committed_lsn_ = 0;
  std::chrono::steady_clock::time_point last_commit_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

// A trajectory's tool loop as logged: the tokens of its finished turns with the injected results
// in place (TurnBoundary records), the current turn's logged tokens, and its calls (results
// replayed from ToolResult records). The log's indexes are trajectory indexes (wal/wal.h), the
// same as the client's: they are used as they are.
struct LoggedTurns {
  std::vector<int32_t> ids;  // sampled + injected tokens before the current turn
  std::vector<float> lps;    // 0.0 for injected
  std::vector<uint8_t> mask;
  std::vector<wire::VersionSpan> versions;  // every logged span; begin = trajectory index
  std::vector<int32_t> turn_ids;  // the current turn's logged tokens, from index ids.size()
  std::vector<float> turn_lps;
  int32_t turns = 1;  // the current turn (1-based)
  std::vector<ToolOutcome> calls;
  // The last call's result is not injected yet (no TurnBoundary after it): with a result it is
  // replayed into the next turn; without one the call runs again (at-least-once).
  bool pending_call = false;
  double sandbox_seconds = 0, sandbox_cpu_seconds = 0;
};
LoggedTurns RebuildTurns(const wal::TrajectoryLog& log);

// A client Trajectory envelope for a trajectory known only from the log (finished before a
// restart): ids, logprob bits, finish reason, version spans and fingerprint from the records.
std::string BuildLoggedTrajectory(const wal::TrajectoryLog& log, const SampleAddress& at,
                                  const Cost& cost, std::string_view client_tag);

// A client Trajectory envelope that carries only an error (a quarantined trajectory).
std::string BuildErrorTrajectory(const SampleAddress& at, const Status& error,
                                 std::string_view client_tag);

}  // namespace bitroll::rollout
