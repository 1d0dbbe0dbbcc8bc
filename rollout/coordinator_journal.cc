// What the coordinator logs when (the table is in rollout/coordinator_journal.h): the Journal's
// events, each deciding what goes to the WAL and what waits for durability, then the logging
// itself (State::LogDispatch, LogChunk, LogFinish, CommitAndDeliver).
#include "rollout/coordinator_journal.h"

namespace bitroll::rollout {

Coordinator::State::State(zmq::context_t& ctx, const CoordinatorOptions& o)
    : options(o),
      front(ctx, zmq::socket_type::router),
      back(ctx, zmq::socket_type::router),
      outbox([this](const std::string& c, std::string_view b) { return SendFront(c, b); },
             o.max_client_buffer_bytes,
             o.wal.dir.empty() ? "aborted" : "detached (re-attach to get them)"),
      connections(kMaxTrackedConnections,
                  [this] {
                    std::vector<std::string> held;
                    for (const Group* g : table.All()) held.push_back(g->client);
                    return held;
                  }),
      weights(replicas, o.decode, o.stream_timeout_ms,
              WeightsGate::Hooks{
                  [this](int r, std::string_view b) { SendReplicaBytes(r, b); },
                  [this](const std::string& c, uint64_t id, const Status& st, uint64_t v) {
                    if (st.ok()) return SendAck(c, id, v);
                    SendError(c, id, st);
                  },
                  [this](const WeightsGate::Installed& w) {
                    journal->OnWeightsInstalled(w);
                    ReleaseWaitingWork();
                  }}),
      journal(std::make_unique<Journal>(*this)) {}

// ---- events ----

using Journal = Coordinator::State::Journal;

Status Journal::Healthy() const {
  if (s_.wal && !s_.wal->status().ok()) {
    return s_.wal->status().WithContext("WAL failed; not accepting new work");
  }
  return Status::Ok();
}

Status Journal::CheckGroupSize(uint64_t samples) const {
  if (s_.wal && samples > kWalMaxSamples) {
    return Status::InvalidArgument("a group has at most " + std::to_string(kWalMaxSamples) +
                                   " samples when the WAL is on");
  }
  return Status::Ok();
}

Status Journal::OnGroupAdmitted(std::string_view request, uint64_t* serial, bool* pending) {
  *serial = 0;
  *pending = false;
  if (!s_.wal) return Status::Ok();
  // Logged before anything about the group is acknowledged (no trajectory is delivered
  // before its own records, which follow this one, are durable).
  *serial = s_.next_serial++;
  Status ls = s_.wal->LogGroup(*serial, request);
  if (!ls.ok()) return ls.WithContext("WAL append");
  *pending = true;
  return Status::Ok();
}

void Journal::OnDispatched(Work* w) {
  if (s_.wal) s_.LogDispatch(w);
}

void Journal::OnChunk(Work* w, const wire::TokenChunk& c) {
  if (s_.wal) s_.LogChunk(w, c);
}

void Journal::OnTurnEnded(Work* w, const wire::Trajectory& t) {
  if (!s_.wal) return;
  const uint32_t n = t.ids() ? t.ids()->size() : 0;
  // The turn's tokens not streamed yet, then the call: the call's token_index is the turn end.
  const size_t logged = w->tokens.size() - w->sampled_base;
  if (n > logged) {
    const int32_t* ids = t.ids()->data() + logged;
    const float* lps = t.logprobs()->data() + logged;
    const size_t k = n - logged;
    w->tokens.insert(w->tokens.end(), ids, ids + k);
    w->logprobs.insert(w->logprobs.end(), lps, lps + k);
    s_.CheckWal(s_.wal->LogTokens(w->id, {ids, k}, {lps, k}, s_.weights.version()));
  }
}

void Journal::OnToolCallStarted(const Work& w, const ToolOutcome& o, uint32_t index) {
  if (s_.wal) s_.CheckWal(s_.wal->LogToolCall(w.id, ToWalCall(o, index)));
}

void Journal::OnToolCallFinished(const Work& w, const ToolOutcome& o, uint32_t index) {
  if (s_.wal) s_.CheckWal(s_.wal->LogToolResult(w.id, ToWalResult(o, index)));
}

void Journal::OnTurnBoundary(const Work& w, const flatbuffers::Vector<int32_t>& ids) {
  if (!s_.wal) return;
  wal::TurnBoundary b;
  b.turn_index = w.boundaries;
  b.injected_tokens.assign(ids.begin(), ids.end());
  s_.CheckWal(s_.wal->LogTurnBoundary(w.id, b));
}

bool Journal::OnTrajectoryFinished(const Work& w, const wire::Trajectory& t,
                                   std::string* envelope) {
  if (!s_.wal) return false;
  // Delivered by DeliverDurable() once the finish record is durable.
  s_.LogFinish(w, t, std::move(*envelope));
  return true;
}

void Journal::OnWorkAborted(const Work& w) {
  if (s_.wal && w.header_logged) (void)s_.wal->Discard(w.id);
}

void Journal::OnGroupAborted(Group* g) {
  if (s_.wal && g->group_pending) {
    (void)s_.wal->AckGroup(g->serial);
    g->group_pending = false;
  }
}

void Journal::OnWeightsInstalled(const WeightsGate::Installed& w) {
  if (!s_.wal) return;
  s_.SaveLiveWeights(w);          // weights.json: what a restart re-applies
  s_.RecordVersionInRegistry(w);  // weights.jsonl, fsync'd before the Ack
}

int Journal::PollWaitMs(int wait_ms) const {
  if (s_.wal && !s_.held.empty()) {
    return std::min(wait_ms, std::max(1, s_.wal->MsUntilCommit()));
  }
  return wait_ms;
}

void Journal::DeliverDurable() {
  if (s_.wal) s_.CommitAndDeliver();
}

void Journal::OnHousekeeping(Clock::time_point now) {
  if (s_.wal && now - s_.last_retention_check > std::chrono::seconds(1)) {
    s_.EnforceRetention();
    s_.last_retention_check = now;
  }
}

// ---- the logging ----

void Coordinator::State::ReportWalError(const Status& s) {
  if (wal_error_reported) return;
  wal_error_reported = true;
  spdlog::error("coordinator: WAL failed, no new work is accepted: {}", s.ToString());
  if (options.metrics) options.metrics->SetWalFailed(s.ToString());
  for (Group* g : table.All()) {
    if (!g->client.empty()) {
      SendError(g->client, 0, s.WithContext("WAL failed; results not yet durable are held"),
                g->group_id);
    }
  }
}

void Coordinator::State::CheckWal(const Status& s) {
  if (!s.ok()) ReportWalError(wal->status().ok() ? s : wal->status());
}

void Coordinator::State::LogDispatch(Work* w) {
  Group* g = w->group;
  if (!w->header_logged) {
    NumericsFingerprint fp = fingerprint.value_or(NumericsFingerprint{});
    // The hash of the live version once an update installed it.
    if (weights.live_weights_hash() != 0) fp.weights_hash = weights.live_weights_hash();
    CheckWal(wal->LogHeader(w->id, g->serial, w->sample_index, *g->submit, g->buffer,
                            weights.version(), fp));
    w->header_logged = true;
    if (g->unheadered > 0 && --g->unheadered == 0 && g->group_pending) {
      CheckWal(wal->AckGroup(g->serial));
      g->group_pending = false;
    }
  }
  // Forced: the current turn's logged tokens (earlier turns travel as context_ids).
  w->forced =
      static_cast<uint32_t>(w->tokens.size() - std::min<size_t>(w->tokens.size(), w->sampled_base));
  if (w->forced > 0) {
    wal->counters.forced_tokens += w->forced;
    ++wal->counters.resumed;
  }
}

void Coordinator::State::LogChunk(Work* w, const wire::TokenChunk& c) {
  if (c.ids() == nullptr || c.logprobs() == nullptr || c.ids()->size() != c.logprobs()->size()) {
    return;
  }
  const auto n = static_cast<int64_t>(c.ids()->size());
  // Replicas count positions from the start of the turn; the WAL counts sampled tokens.
  const int64_t begin = c.position_begin() + static_cast<int64_t>(w->sampled_base);
  const auto have = static_cast<int64_t>(w->tokens.size());
  for (int64_t i = 0; i < n && begin + i < have; ++i) {
    const int32_t id = c.ids()->Get(static_cast<uint32_t>(i));
    const float lp = c.logprobs()->Get(static_cast<uint32_t>(i));
    const size_t at = static_cast<size_t>(begin + i);
    if (id != w->tokens[at] || std::memcmp(&lp, &w->logprobs[at], sizeof(float)) != 0) {
      ++wal->counters.forced_mismatches;
      spdlog::error("coordinator: trajectory {} token {} re-scored differently from the WAL", w->id,
                    at);
    }
  }
  const int64_t skip = std::max<int64_t>(0, have - begin);
  if (skip >= n) return;
  if (begin + skip != have) {
    spdlog::error("coordinator: trajectory {} chunk at {} leaves a gap after {} tokens", w->id,
                  begin, have);
    return;
  }
  const int32_t* ids = c.ids()->data() + skip;
  const float* lps = c.logprobs()->data() + skip;
  const auto m = static_cast<size_t>(n - skip);
  w->tokens.insert(w->tokens.end(), ids, ids + m);
  w->logprobs.insert(w->logprobs.end(), lps, lps + m);
  CheckWal(wal->LogTokens(w->id, {ids, m}, {lps, m}, c.weight_version()));
}

void Coordinator::State::LogFinish(const Work& w, const wire::Trajectory& t, std::string envelope) {
  // Tokens the replica did not stream (none when it streams every one) are logged first.
  if (t.ids() && t.logprobs() && t.ids()->size() == t.logprobs()->size() &&
      w.sampled_base + t.ids()->size() > w.tokens.size()) {
    const size_t k = w.tokens.size() - w.sampled_base, m = t.ids()->size() - k;
    CheckWal(wal->LogTokens(w.id, {t.ids()->data() + k, m}, {t.logprobs()->data() + k, m},
                            weights.version()));
  }
  const std::string err = t.error() && t.error()->message() ? t.error()->message()->str() : "";
  Result<RoutingRecord> routing = RoutingFromWire(t.routing());  // kept for recovery
  CheckWal(wal->LogFinish(w.id, t.finish(), err, routing.ok() ? &*routing : nullptr));
  HeldDelivery d;
  d.traj = w.id;
  d.group_key = w.group->key;
  d.flat = WalFlatOf(w.id);
  d.envelope = std::move(envelope);
  d.failed = t.finish() == wire::FinishReason_Error;
  d.lsn = wal->LastLsn();
  held.push_back(std::move(d));
}

void Coordinator::State::CommitAndDeliver() {
  CheckWal(wal->MaybeCommit());
  // By LSN, not by trajectory: a held trajectory stays deliverable whatever happens to its
  // records meanwhile (an Ack, a Discard).
  const uint64_t durable = wal->DurableLsn();
  while (!held.empty() && held.front().lsn <= durable) {
    HeldDelivery d = std::move(held.front());
    held.pop_front();
    Group* g = table.Find(d.group_key);
    if (g == nullptr) continue;  // aborted meanwhile
    // The WAL counts a record's bytes when it commits: set them in the envelope built at finish
    // (Work -> BuildFinal with wal_bytes_slot), in place rather than encoding it again.
    const auto wal_bytes = static_cast<int64_t>(wal->Bytes(d.traj));
    if (!SetTrajectoryWalBytes(d.envelope, wal_bytes)) {
      spdlog::error("coordinator: trajectory {} envelope has no cost.wal_bytes slot", d.traj);
    }
    Deliver(g, d.flat, std::move(d.envelope), d.failed, wal_bytes);
  }
}

}  // namespace bitroll::rollout
