// What the coordinator logs when (the table is in rollout/coordinator_journal.h): the Journal's
// events, each deciding what goes to the WAL and what waits for durability, the delivery of
// durable trajectories, retention, and the records of the live weights.
#include "rollout/coordinator_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "rollout/weights_registry.h"

namespace bitroll::rollout {

Journal::Journal(Options options, GroupTable& table, WeightsGate& weights,
                 const std::optional<NumericsFingerprint>& fingerprint, Hooks hooks)
    : options_(std::move(options)),
      table_(table),
      weights_(weights),
      fingerprint_(fingerprint),
      hooks_(std::move(hooks)) {}

void Journal::Check(const Status& s) {
  if (s.ok()) return;
  const Status sticky = wal_->status().ok() ? s : wal_->status();
  if (error_reported_) return;
  error_reported_ = true;
  spdlog::error("coordinator: WAL failed, no new work is accepted: {}", sticky.ToString());
  hooks_.failed(sticky);
}

// ---- admission ----

Status Journal::Healthy() const {
  if (wal_ && !wal_->status().ok()) {
    return wal_->status().WithContext("WAL failed; not accepting new work");
  }
  return Status::Ok();
}

Status Journal::CheckGroupSize(uint64_t samples) const {
  if (wal_ && samples > kWalMaxSamples) {
    return Status::InvalidArgument("a group has at most " + std::to_string(kWalMaxSamples) +
                                   " samples when the WAL is on");
  }
  return Status::Ok();
}

Status Journal::OnGroupAdmitted(std::string_view request, uint64_t* serial, bool* pending) {
  *serial = 0;
  *pending = false;
  if (!wal_) return Status::Ok();
  // Logged before anything about the group is acknowledged (no trajectory is delivered
  // before its own records, which follow this one, are durable).
  *serial = next_serial_++;
  Status ls = wal_->LogGroup(*serial, request);
  if (!ls.ok()) return ls.WithContext("WAL append");
  *pending = true;
  return Status::Ok();
}

// ---- per trajectory ----

void Journal::OnDispatched(Work* w) {
  if (!wal_) return;
  Group* g = w->group;
  if (!w->header_logged) {
    NumericsFingerprint fp = fingerprint_.value_or(NumericsFingerprint{});
    // The hash of the live version once an update installed it.
    if (weights_.live_weights_hash() != 0) fp.weights_hash = weights_.live_weights_hash();
    Check(wal_->LogHeader(w->id, g->serial, w->sample_index, *g->submit, g->buffer,
                          weights_.version(), fp));
    w->header_logged = true;
    if (g->unheadered > 0 && --g->unheadered == 0 && g->group_pending) {
      Check(wal_->AckGroup(g->serial));
      g->group_pending = false;
    }
  }
  // Forced: the current turn's logged tokens (earlier turns travel as context_ids).
  w->forced = static_cast<uint32_t>(w->tokens.size());
  if (w->forced > 0) {
    wal_->counters.forced_tokens += w->forced;
    ++wal_->counters.resumed;
  }
}

void Journal::OnChunk(Work* w, const wire::TokenChunk& c) {
  if (!wal_) return;
  if (c.ids() == nullptr || c.logprobs() == nullptr || c.ids()->size() != c.logprobs()->size()) {
    return;
  }
  const auto n = static_cast<int64_t>(c.ids()->size());
  // position_begin is a trajectory index; the current turn's tokens start after the context (the
  // replica reports the turn's injected ids, OnInjected, before any of its tokens).
  const auto base = static_cast<int64_t>(w->ctx_ids.size());
  if (c.position_begin() < base) {
    spdlog::error("coordinator: trajectory {} chunk at {} is before its turn's first token {}",
                  w->id, c.position_begin(), base);
    return;
  }
  const int64_t begin = c.position_begin() - base;  // offset in the turn's tokens
  const auto have = static_cast<int64_t>(w->tokens.size());
  for (int64_t i = 0; i < n && begin + i < have; ++i) {
    const int32_t id = c.ids()->Get(static_cast<uint32_t>(i));
    const float lp = c.logprobs()->Get(static_cast<uint32_t>(i));
    const size_t at = static_cast<size_t>(begin + i);
    if (id != w->tokens[at] || std::memcmp(&lp, &w->logprobs[at], sizeof(float)) != 0) {
      ++wal_->counters.forced_mismatches;
      spdlog::error("coordinator: trajectory {} token {} re-scored differently from the WAL", w->id,
                    base + begin + i);
    }
  }
  const int64_t skip = std::max<int64_t>(0, have - begin);
  if (skip >= n) return;
  if (begin + skip != have) {
    spdlog::error("coordinator: trajectory {} chunk at {} leaves a gap after {} tokens", w->id,
                  base + begin, base + have);
    return;
  }
  const int32_t* ids = c.ids()->data() + skip;
  const float* lps = c.logprobs()->data() + skip;
  const auto m = static_cast<size_t>(n - skip);
  w->tokens.insert(w->tokens.end(), ids, ids + m);
  w->logprobs.insert(w->logprobs.end(), lps, lps + m);
  Check(wal_->LogTokens(w->id, {ids, m}, {lps, m}, c.weight_version()));
}

void Journal::OnTurnEnded(Work* w, const wire::Trajectory& t) {
  if (!wal_) return;
  const uint32_t n = t.ids() ? t.ids()->size() : 0;
  // The turn's tokens not streamed yet, then the call: the call's token_index is the turn end.
  const size_t logged = w->tokens.size();
  if (n > logged) {
    const size_t k = n - logged;
    Check(wal_->LogTokens(w->id, {t.ids()->data() + logged, k}, {t.logprobs()->data() + logged, k},
                          weights_.version()));
  }
  // The turn's tokens join the context (ContinueToolLoop); the next turn starts empty.
  w->tokens.clear();
  w->logprobs.clear();
}

void Journal::OnToolCallStarted(const Work& w, const ToolOutcome& o, uint32_t index) {
  if (wal_) Check(wal_->LogToolCall(w.id, ToWalCall(o, index)));
}

void Journal::OnToolCallFinished(const Work& w, const ToolOutcome& o, uint32_t index) {
  if (wal_) Check(wal_->LogToolResult(w.id, ToWalResult(o, index)));
}

void Journal::OnTurnBoundary(const Work& w, const flatbuffers::Vector<int32_t>& ids) {
  if (!wal_) return;
  wal::TurnBoundary b;
  b.turn_index = w.boundaries;
  b.injected_tokens.assign(ids.begin(), ids.end());
  Check(wal_->LogTurnBoundary(w.id, b));
}

bool Journal::OnTrajectoryFinished(const Work& w, std::string* envelope) {
  if (!wal_) return false;
  // Delivered by DeliverDurable() once the finish record is durable.
  LogFinish(w, std::move(*envelope));
  return true;
}

void Journal::LogFinish(const Work& w, std::string envelope) {
  // The client's trajectory: every token after the prompt, the last turn's after the context.
  const wire::Trajectory* t = wire::GetEnvelope(envelope.data())->msg_as_Trajectory();
  const size_t base = w.ctx_ids.size() + w.tokens.size();
  // Tokens the replica did not stream (none when it streams every one) are logged first.
  if (t != nullptr && t->ids() && t->logprobs() && t->ids()->size() == t->logprobs()->size() &&
      t->ids()->size() > base) {
    const size_t m = t->ids()->size() - base;
    Check(wal_->LogTokens(w.id, {t->ids()->data() + base, m}, {t->logprobs()->data() + base, m},
                          weights_.version()));
  }
  const wire::FinishReason finish = t != nullptr ? t->finish() : wire::FinishReason_Error;
  const std::string err =
      t != nullptr && t->error() && t->error()->message() ? t->error()->message()->str() : "";
  Result<RoutingRecord> routing = RoutingFromWire(t != nullptr ? t->routing() : nullptr);
  Check(wal_->LogFinish(w.id, finish, err, routing.ok() ? &*routing : nullptr));
  HeldDelivery d;
  d.traj = w.id;
  d.group_key = w.group->key;
  d.flat = WalFlatOf(w.id);
  d.envelope = std::move(envelope);
  d.failed = finish == wire::FinishReason_Error;
  d.lsn = wal_->LastLsn();
  held_.push_back(std::move(d));
}

void Journal::OnWorkAborted(const Work& w) {
  if (wal_ && w.header_logged) (void)wal_->Discard(w.id);
}

void Journal::OnGroupAborted(Group* g) {
  if (wal_ && g->group_pending) {
    (void)wal_->AckGroup(g->serial);
    g->group_pending = false;
  }
}

// ---- the loop ----

int Journal::PollWaitMs(int wait_ms) const {
  if (wal_ && !held_.empty()) return std::min(wait_ms, std::max(1, wal_->MsUntilCommit()));
  return wait_ms;
}

void Journal::DeliverDurable() {
  if (!wal_) return;
  Check(wal_->MaybeCommit());
  // By LSN, not by trajectory: a held trajectory stays deliverable whatever happens to its
  // records meanwhile (an Ack, a Discard).
  const uint64_t durable = wal_->DurableLsn();
  while (!held_.empty() && held_.front().lsn <= durable) {
    HeldDelivery d = std::move(held_.front());
    held_.pop_front();
    Group* g = table_.Find(d.group_key);
    if (g == nullptr) continue;  // aborted meanwhile
    // The WAL counts a record's bytes when it commits: set them in the envelope the replica built
    // (a slot for every Cost field), in place rather than encoding it again.
    const auto wal_bytes = static_cast<int64_t>(wal_->Bytes(d.traj));
    if (!SetTrajectoryWalBytes(d.envelope, wal_bytes)) {
      spdlog::error("coordinator: trajectory {} envelope has no cost.wal_bytes slot", d.traj);
    }
    hooks_.deliver(g, d.flat, std::move(d.envelope), d.failed, wal_bytes);
  }
}

void Journal::OnHousekeeping(Clock::time_point now) {
  if (wal_ && now - last_retention_check_ > std::chrono::seconds(1)) {
    EnforceRetention(Clock::now());
    last_retention_check_ = now;
  }
}

void Journal::EnforceRetention(Clock::time_point now) {
  for (const GroupTable::Expired& e :
       table_.Expire(now, options_.retention_max_age, options_.retention_max_groups)) {
    const ParkedGroup& p = e.group;
    spdlog::warn(
        "coordinator: retention: discarding group={} from the WAL: {} of its {} trajectories "
        "were never acknowledged ({})",
        p.group_id, p.delivered - p.acked, p.total,
        e.too_many ? "more finished groups than retention.max_groups" : "older than max_age_s");
    for (uint32_t flat = 0; flat < p.total; ++flat) (void)wal_->Discard(WalTrajId(p.serial, flat));
  }
}

// ---- weights ----

void Journal::OnWeightsInstalled(const WeightsGate::Installed& w) {
  if (!wal_) return;
  const std::filesystem::path dir(options_.dir);
  // weights.json: what a restart re-applies. Only a path can be reloaded; after streamed or
  // NCCL weights the record says what to resend.
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
  // weights.jsonl (rollout/weights_registry.h), fsync'd before the update is acknowledged.
  Status s = RecordWeightsVersion(options_.dir, w.version, w.source, w.path, w.weights_hash);
  if (!s.ok()) {
    spdlog::error("coordinator: weights version={} is not in the weights registry: {}", w.version,
                  s.ToString());
  }
}

void Journal::RestoreLiveWeights() {
  const std::filesystem::path file = std::filesystem::path(options_.dir) / "weights.json";
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
    weights_.Restore(path, version, RegisteredWeightsHash(options_.dir, version));
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
