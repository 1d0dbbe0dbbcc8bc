#include "rollout/wal_log.h"

#include <algorithm>
#include <vector>

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
                         uint64_t weight_version, const engine::NumericsFingerprint& fp) {
  wal::TrajectoryHeader h;
  h.request.assign(request.data(), request.size());
  h.group_id = serial;
  h.sample_index = sample_index;
  h.seed = m.seed();
  if (const auto* s = m.sampling()) {
    h.sampling.temperature = s->temperature();
    h.sampling.top_k = s->top_k();
    h.sampling.top_p = s->top_p();
    h.sampling.min_p = s->min_p();
  }
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

std::string BuildLoggedTrajectory(const wal::TrajectoryLog& log, const SampleAddress& at,
                                  const CostInfo& cost, std::string_view client_tag) {
  flatbuffers::FlatBufferBuilder fbb(256 + log.token_ids.size() * 8);
  auto ids = fbb.CreateVector(log.token_ids);
  auto lps = fbb.CreateVector(log.logprobs);
  std::vector<wire::VersionSpan> spans;
  for (const wal::TokenSpan& s : log.spans) {
    if (spans.empty() || spans.back().version() != s.weight_version) {
      spans.emplace_back(static_cast<int32_t>(s.first_token), s.weight_version);
    }
  }
  auto vs = fbb.CreateVectorOfStructs(spans);
  const wal::NumericsFingerprint& f = log.header.fingerprint;
  auto fp = wire::CreateFingerprint(fbb, f.weights_hash, f.kernel_version, f.attention_chunk,
                                    fbb.CreateString(f.backend));
  auto c = BuildCost(fbb, cost);
  auto rep = fbb.CreateString("wal");
  auto tag = fbb.CreateString(client_tag.data(), client_tag.size());
  const auto reason = static_cast<wire::FinishReason>(log.finish ? log.finish->reason : 0);
  flatbuffers::Offset<wire::Error> err;
  if (reason == wire::FinishReason_Error) {
    err = wire::CreateError(fbb, wire::ErrorCode_Internal,
                            fbb.CreateString(log.finish ? log.finish->error : ""), at.group_id);
  }
  wire::TrajectoryBuilder b(fbb);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_ids(ids);
  b.add_logprobs(lps);
  b.add_finish(reason);
  b.add_turns(1);
  b.add_versions(vs);
  b.add_fingerprint(fp);
  b.add_cost(c);
  b.add_replica(rep);
  if (!client_tag.empty()) b.add_client_tag(tag);
  if (!err.IsNull()) b.add_error(err);
  return FinishTrajectory(fbb, b.Finish());
}

std::string BuildErrorTrajectory(const SampleAddress& at, const Status& error,
                                 std::string_view client_tag) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto err =
      wire::CreateError(fbb, ToWire(error.code()), fbb.CreateString(error.message()), at.group_id);
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
