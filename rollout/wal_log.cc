#include "rollout/wal_log.h"

#include <algorithm>
#include <vector>

#include "rollout/metrics.h"

namespace bitroll::rollout {

Result<std::unique_ptr<WalLog>> WalLog::Open(const WalServiceOptions& options) {
  if (options.commit_interval_ms < 0) {
    return Status::InvalidArgument("WAL commit interval must be >= 0 ms");
  }
  wal::WalOptions wo;
  wo.dir = options.dir;
  wo.durability = options.durability;
  wo.background_commit = false;  // the coordinator loop commits between passes
  wo.commit_interval_ms = std::max(1, options.commit_interval_ms);
  wo.sync_window_ms = options.sync_window_ms;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<wal::Wal> w, wal::Wal::Open(wo));
  return std::unique_ptr<WalLog>(new WalLog(options, std::move(w)));
}

Status WalLog::LogHeader(uint64_t traj, uint64_t serial, uint32_t sample_index,
                         const wire::SubmitRollouts& m, std::string_view request,
                         uint64_t weight_version, const NumericsFingerprint& fp) {
  wal::TrajectoryHeader h;
  h.request.assign(request.data(), request.size());
  h.group_id = serial;
  h.sample_index = sample_index;
  h.sampling = SamplingFromWire(m);
  h.max_tokens = static_cast<uint32_t>(std::max(0, m.max_tokens()));
  h.weight_version = weight_version;
  h.fingerprint.weights_hash = fp.weights_hash;
  h.fingerprint.kernel_version = fp.kernel_version;
  h.fingerprint.attention_chunk = fp.attention_chunk;
  h.fingerprint.backend = fp.backend;
  return wal_->AppendHeader(traj, h);
}

Status WalLog::LogTokens(uint64_t traj, std::span<const int32_t> ids, std::span<const float> lps,
                         uint64_t weight_version) {
  if (ids.empty()) return Status::Ok();
  BR_RETURN_IF_ERROR(wal_->AppendTokens(traj, ids, lps, weight_version));
  counters.tokens_logged += ids.size();
  return Status::Ok();
}

Status WalLog::MaybeCommit(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_commit_ < std::chrono::milliseconds(options_.commit_interval_ms)) {
    return wal_->status();
  }
  last_commit_ = now;
  if (wal_->LastLsn() == committed_lsn_) {
    // Nothing new, but committed records may still await their sync (kWindow): make them
    // durable once the window has passed, so that held deliveries are not stuck.
    if (wal_->DurableLsn() < committed_lsn_ &&
        now - last_flush_ >= std::chrono::milliseconds(options_.sync_window_ms)) {
      last_flush_ = now;
      return wal_->Flush();
    }
    return wal_->status();
  }
  const uint64_t last = wal_->LastLsn();
  BR_RETURN_IF_ERROR(wal_->Commit());
  if (metrics) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - now;
    metrics->WalCommitted(took.count(), wal_->stats().bytes_written);
  }
  committed_lsn_ = last;
  return Status::Ok();
}

int WalLog::MsUntilCommit() const {
  const auto due = last_commit_ + std::chrono::milliseconds(options_.commit_interval_ms);
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(due - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
}

namespace {

std::string FinishTrajectory(flatbuffers::FlatBufferBuilder& fbb,
                             flatbuffers::Offset<wire::Trajectory> t) {
  FinishEnvelope(fbb, 0, wire::Message_Trajectory, t.Union());
  return std::string(BufferView(fbb));
}

}  // namespace

LoggedTurns RebuildTurns(const wal::TrajectoryLog& log) {
  LoggedTurns lt;
  // The current turn starts after the last injection, or after the last call when its result is
  // not injected yet (the turn that made it is over).
  lt.pending_call = log.tool_calls.size() > log.turns.size();
  uint32_t begin = 0;
  if (lt.pending_call) {
    begin = log.tool_calls.back().call.token_index;
  } else if (!log.turns.empty()) {
    const wal::TurnBoundary& b = log.turns.back();
    begin = b.token_index + static_cast<uint32_t>(b.injected_tokens.size());
  }
  // Every logged token in trajectory order: sampled spans and injected boundaries interleave by
  // index (the reader checked that they are contiguous).
  size_t sampled = 0, k = 0;
  auto push_sampled = [&](const wal::TokenSpan& s) {
    for (uint32_t i = 0; i < s.count && sampled < log.token_ids.size(); ++i, ++sampled) {
      const bool before = s.first_token + i < begin;
      (before ? lt.ids : lt.turn_ids).push_back(log.token_ids[sampled]);
      (before ? lt.lps : lt.turn_lps).push_back(log.logprobs[sampled]);
      if (before) lt.mask.push_back(1);
    }
    if (lt.versions.empty() || lt.versions.back().version() != s.weight_version) {
      lt.versions.emplace_back(static_cast<int32_t>(s.first_token), s.weight_version);
    }
  };
  for (const wal::TurnBoundary& b : log.turns) {
    for (; k < log.spans.size() && log.spans[k].first_token < b.token_index; ++k) {
      push_sampled(log.spans[k]);
    }
    lt.ids.insert(lt.ids.end(), b.injected_tokens.begin(), b.injected_tokens.end());
    lt.lps.resize(lt.lps.size() + b.injected_tokens.size(), 0.0f);
    lt.mask.resize(lt.mask.size() + b.injected_tokens.size(), 0);
    ++lt.turns;
  }
  for (; k < log.spans.size(); ++k) push_sampled(log.spans[k]);
  if (lt.pending_call) ++lt.turns;
  for (const wal::ToolCallLog& c : log.tool_calls) {
    ToolOutcome o = FromWal(c);
    lt.sandbox_seconds += o.wall_seconds;
    lt.sandbox_cpu_seconds += o.cpu_seconds;
    lt.calls.push_back(std::move(o));
  }
  return lt;
}

std::string BuildLoggedTrajectory(const wal::TrajectoryLog& log, const SampleAddress& at,
                                  const Cost& cost_in, std::string_view client_tag) {
  const LoggedTurns lt = RebuildTurns(log);
  // A finished trajectory: its last turn's tokens follow the rebuilt ones.
  std::vector<int32_t> all = lt.ids;
  std::vector<float> all_lps = lt.lps;
  std::vector<uint8_t> mask = lt.mask;
  all.insert(all.end(), lt.turn_ids.begin(), lt.turn_ids.end());
  all_lps.insert(all_lps.end(), lt.turn_lps.begin(), lt.turn_lps.end());
  mask.resize(all.size(), 1);
  Cost cost = cost_in;
  cost.sandbox_seconds += lt.sandbox_seconds;
  cost.sandbox_cpu_seconds += lt.sandbox_cpu_seconds;
  flatbuffers::FlatBufferBuilder fbb(256 + all.size() * 9);
  auto ids = fbb.CreateVector(all);
  auto lps = fbb.CreateVector(all_lps);
  auto mk = fbb.CreateVector(mask);
  std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
  for (const ToolOutcome& o : lt.calls) cv.push_back(BuildToolCallInfo(fbb, o, at.group_id));
  auto calls = fbb.CreateVector(cv);
  const std::vector<wire::VersionSpan>& spans = lt.versions;
  auto vs = fbb.CreateVectorOfStructs(spans);
  const NumericsFingerprint& f = log.header.fingerprint;
  auto fp = wire::CreateFingerprint(fbb, f.weights_hash, f.kernel_version, f.attention_chunk,
                                    fbb.CreateString(f.backend));
  auto c = CostToWire(fbb, cost);
  auto rep = fbb.CreateString("wal");
  auto tag = fbb.CreateString(client_tag.data(), client_tag.size());
  const auto reason = FinishToWire(log.finish ? log.finish->reason : FinishReason::kNone);
  flatbuffers::Offset<wire::Error> err;
  if (reason == wire::FinishReason_Error) {
    err = wire::CreateError(fbb, wire::ErrorCode_Internal,
                            fbb.CreateString(log.finish ? log.finish->error : ""), at.group_id);
  }
  flatbuffers::Offset<wire::Routing> routing;
  if (log.finish && !log.finish->routing.empty()) {
    routing = RoutingToWire(fbb, log.finish->routing);
  }
  wire::TrajectoryBuilder b(fbb);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_ids(ids);
  b.add_logprobs(lps);
  b.add_finish(reason);
  b.add_turns(lt.turns);
  b.add_versions(vs);
  b.add_fingerprint(fp);
  b.add_mask(mk);
  if (!cv.empty()) b.add_tool_calls(calls);
  b.add_cost(c);
  b.add_replica(rep);
  if (!client_tag.empty()) b.add_client_tag(tag);
  if (!err.IsNull()) b.add_error(err);
  if (!routing.IsNull()) b.add_routing(routing);
  return FinishTrajectory(fbb, b.Finish());
}

std::string BuildErrorTrajectory(const SampleAddress& at, const Status& error,
                                 std::string_view client_tag) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto err = ErrorToWire(fbb, error, at.group_id);
  auto tag = fbb.CreateString(client_tag.data(), client_tag.size());
  wire::TrajectoryBuilder b(fbb);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_finish(wire::FinishReason_Error);
  if (!client_tag.empty()) b.add_client_tag(tag);
  b.add_error(err);
  return FinishTrajectory(fbb, b.Finish());
}

}  // namespace bitroll::rollout
