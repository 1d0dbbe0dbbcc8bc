#include "rollout/messages.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

namespace bitroll::rollout {

namespace {

template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> CopyVector(flatbuffers::FlatBufferBuilder& fbb,
                                                       const flatbuffers::Vector<T>* v) {
  return fbb.CreateVector(v ? v->data() : nullptr, v ? v->size() : 0);
}

}  // namespace

flatbuffers::Offset<wire::ToolCallInfo> CopyToolCallInfo(flatbuffers::FlatBufferBuilder& fbb,
                                                         const wire::ToolCallInfo& c) {
  auto name = fbb.CreateString(c.name() ? c.name()->str() : "");
  auto input = fbb.CreateString(c.input() ? c.input()->str() : "");
  auto out = fbb.CreateString(c.output() ? c.output()->str() : "");
  flatbuffers::Offset<wire::Error> err;
  if (const auto* e = c.error()) {
    err = wire::CreateError(
        fbb, e->code(), fbb.CreateString(e->message() ? e->message()->str() : ""), e->group_id());
  }
  return wire::CreateToolCallInfo(fbb, name, input, c.tier(), c.exit_status(), out,
                                  c.output_truncated(), err, c.wall_seconds(), c.cpu_seconds(),
                                  c.token_index(), c.replayed());
}

void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const FinalTurn& t,
                           const TurnPrefix& prefix, const SampleAddress& at,
                           std::string_view replica, const std::string* client_tag) {
  const size_t k = prefix.ids.size(), j = prefix.injected.size(), n = t.ids.size();
  int32_t* ids_out = nullptr;
  auto ids = fbb.CreateUninitializedVector(k + j + n, &ids_out);
  if (k > 0) std::memcpy(ids_out, prefix.ids.data(), k * sizeof(int32_t));
  if (j > 0) std::memcpy(ids_out + k, prefix.injected.data(), j * sizeof(int32_t));
  if (n > 0) std::memcpy(ids_out + k + j, t.ids.data(), n * sizeof(int32_t));
  float* lps_out = nullptr;
  auto lps = fbb.CreateUninitializedVector(k + j + t.lps.size(), &lps_out);
  const size_t kl = std::min(k, prefix.lps.size());
  if (kl > 0) std::memcpy(lps_out, prefix.lps.data(), kl * sizeof(float));
  std::fill(lps_out + kl, lps_out + k + j, 0.0f);
  if (!t.lps.empty()) std::memcpy(lps_out + k + j, t.lps.data(), t.lps.size() * sizeof(float));
  uint8_t* m = nullptr;  // the earlier turns' mask, 0 for injected ids, 1 for t's sampled tokens
  auto mask = fbb.CreateUninitializedVector(k + j + n, &m);
  const size_t km = std::min(k, prefix.mask.size());
  if (km > 0) std::memcpy(m, prefix.mask.data(), km);
  if (k + j > km) std::memset(m + km, 0, k + j - km);
  if (n > 0) std::memset(m + k + j, 1, n);
  std::vector<wire::VersionSpan> spans(prefix.versions.begin(), prefix.versions.end());
  for (const wire::VersionSpan& v : t.versions) {
    if (!spans.empty() && spans.back().version() == v.version()) continue;
    spans.push_back(v);
  }
  std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
  if (prefix.calls != nullptr) {
    for (const wire::ToolCallInfo* c : *prefix.calls) cv.push_back(CopyToolCallInfo(fbb, *c));
  }
  auto calls = fbb.CreateVector(cv);
  auto vs = fbb.CreateVectorOfStructs(spans);
  flatbuffers::Offset<wire::Routing> routing;
  if (t.routing != nullptr) routing = RoutingToWire(fbb, *t.routing);
  flatbuffers::Offset<wire::Fingerprint> fp;
  if (t.fingerprint != nullptr) fp = FingerprintToWire(fbb, *t.fingerprint);
  fbb.ForceDefaults(true);  // every Cost field gets a slot: SetTrajectoryCost
  auto c = CostToWire(fbb, t.cost);
  fbb.ForceDefaults(false);
  auto rep = fbb.CreateString(replica.data(), replica.size());
  flatbuffers::Offset<flatbuffers::String> tag;
  if (client_tag) tag = fbb.CreateString(*client_tag);
  flatbuffers::Offset<wire::Error> err;
  if (!t.error.ok()) err = ErrorToWire(fbb, t.error, at.group_id);
  wire::TrajectoryBuilder b(fbb);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_ids(ids);
  b.add_logprobs(lps);
  b.add_finish(t.finish);
  b.add_turns(prefix.turns);
  b.add_versions(vs);
  if (!fp.IsNull()) b.add_fingerprint(fp);
  b.add_cost(c);
  b.add_replica(rep);
  if (!tag.IsNull()) b.add_client_tag(tag);
  if (!err.IsNull()) b.add_error(err);
  b.add_mask(mask);
  b.add_tool_calls(calls);
  if (!routing.IsNull()) b.add_routing(routing);
  auto off = b.Finish();
  FinishEnvelope(fbb, 0, wire::Message_Trajectory, off.Union());
}

namespace {

// The Cost of a Trajectory envelope as a table whose stored scalars can be overwritten; null when
// `envelope` is no Trajectory with a Cost.
flatbuffers::Table* MutableCost(std::string& envelope, bool verified = false) {
  if (!verified) {
    flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(envelope.data()), envelope.size());
    if (!wire::VerifyEnvelopeBuffer(v)) return nullptr;  // not an envelope at all
  }
  const wire::Trajectory* t = wire::GetEnvelope(envelope.data())->msg_as_Trajectory();
  if (t == nullptr || t->cost() == nullptr) return nullptr;
  // The generated code has no mutators (flatc without --gen-mutable); wire::Cost is a
  // flatbuffers::Table, whose SetField overwrites a stored scalar in place.
  return reinterpret_cast<flatbuffers::Table*>(const_cast<wire::Cost*>(t->cost()));
}

// Sets every Cost field in `c`, when each has a slot.
bool SetCost(flatbuffers::Table* c, const Cost& cost) {
  if (c == nullptr) return false;
  using C = wire::Cost;
  for (auto f : {C::VT_PREFILL_COMPUTED, C::VT_PREFILL_CACHED, C::VT_DECODE_TOKENS,
                 C::VT_ENGINE_SECONDS, C::VT_QUEUE_SECONDS, C::VT_SANDBOX_SECONDS,
                 C::VT_SANDBOX_CPU_SECONDS, C::VT_WAL_BYTES, C::VT_PRICE_USD}) {
    if (c->GetOptionalFieldOffset(f) == 0) return false;  // no slot: nothing set yet
  }
  c->SetField<int64_t>(C::VT_PREFILL_COMPUTED, cost.prefill_computed);
  c->SetField<int64_t>(C::VT_PREFILL_CACHED, cost.prefill_cached);
  c->SetField<int64_t>(C::VT_DECODE_TOKENS, cost.decode_tokens);
  c->SetField<double>(C::VT_ENGINE_SECONDS, cost.engine_seconds);
  c->SetField<double>(C::VT_QUEUE_SECONDS, cost.queue_seconds);
  c->SetField<double>(C::VT_SANDBOX_SECONDS, cost.sandbox_seconds);
  c->SetField<double>(C::VT_SANDBOX_CPU_SECONDS, cost.sandbox_cpu_seconds);
  c->SetField<int64_t>(C::VT_WAL_BYTES, cost.wal_bytes);
  c->SetField<double>(C::VT_PRICE_USD, cost.price_usd);
  return true;
}

}  // namespace

bool SetTrajectoryCost(std::string& envelope, const Cost& cost) {
  return SetCost(MutableCost(envelope), cost);
}

bool SetVerifiedTrajectoryCost(std::string& envelope, const Cost& cost) {
  return !envelope.empty() && SetCost(MutableCost(envelope, /*verified=*/true), cost);
}

bool SetTrajectoryWalBytes(std::string& envelope, int64_t wal_bytes) {
  flatbuffers::Table* c = MutableCost(envelope);
  return c != nullptr && c->SetField<int64_t>(wire::Cost::VT_WAL_BYTES, wal_bytes);
}

flatbuffers::Offset<wire::FinishedTrajectory> CreateFinished(flatbuffers::FlatBufferBuilder& fbb,
                                                             uint64_t work_id,
                                                             std::string_view envelope) {
  // A nested buffer keeps its own alignment rules: its 8-byte fields stay aligned.
  fbb.ForceVectorAlignment(envelope.size(), 1, 8);
  auto bytes = fbb.CreateVector(reinterpret_cast<const uint8_t*>(envelope.data()), envelope.size());
  return wire::CreateFinishedTrajectory(fbb, work_id, bytes);
}

void BuildClientTokenChunk(flatbuffers::FlatBufferBuilder& fbb, const wire::TokenChunk& c,
                           const SampleAddress& at) {
  auto ids = CopyVector(fbb, c.ids());
  auto lps = CopyVector(fbb, c.logprobs());
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> inj;
  if (c.injected_ids()) inj = CopyVector(fbb, c.injected_ids());
  auto tc = wire::CreateTokenChunk(fbb, at.group_id, at.prompt_index, at.sample_index,
                                   c.position_begin(), ids, lps, c.weight_version(), 0, inj);
  FinishEnvelope(fbb, 0, wire::Message_TokenChunk, tc.Union());
}

void ReplicaWorkBuilder::AddRequest(uint64_t key, std::string_view request, bool transient) {
  if (!index_.insert(key).second) return;
  // A nested buffer keeps its own alignment rules: its 8-byte fields stay aligned.
  fbb_.ForceVectorAlignment(request.size(), 1, 8);
  auto bytes = fbb_.CreateVector(reinterpret_cast<const uint8_t*>(request.data()), request.size());
  requests_.push_back(wire::CreateGroupRequest(fbb_, bytes, key, transient));
}

void ReplicaWorkBuilder::Add(uint64_t key, uint64_t work_id, const SampleAddress& at,
                             std::span<const int32_t> forced, bool stream, const TurnInput* turn) {
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> forced_ids, context;
  flatbuffers::Offset<flatbuffers::String> inject;
  if (!forced.empty()) forced_ids = fbb_.CreateVector(forced.data(), forced.size());
  if (turn != nullptr && !turn->context.empty()) {
    context = fbb_.CreateVector(turn->context.data(), turn->context.size());
  }
  if (turn != nullptr && !turn->inject.empty()) {
    inject = fbb_.CreateString(turn->inject.data(), turn->inject.size());
  }
  flatbuffers::Offset<flatbuffers::Vector<float>> ctx_lps;
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> ctx_mask;
  flatbuffers::Offset<flatbuffers::Vector<const wire::VersionSpan*>> ctx_versions;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::ToolCallInfo>>> calls;
  if (turn != nullptr && !turn->lps.empty()) {
    ctx_lps = fbb_.CreateVector(turn->lps.data(), turn->lps.size());
  }
  if (turn != nullptr && !turn->mask.empty()) {
    ctx_mask = fbb_.CreateVector(turn->mask.data(), turn->mask.size());
  }
  if (turn != nullptr && !turn->versions.empty()) {
    ctx_versions = fbb_.CreateVectorOfStructs(turn->versions.data(), turn->versions.size());
  }
  if (turn != nullptr && !turn->calls.empty()) {
    std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
    for (const ToolOutcome& o : turn->calls) cv.push_back(BuildToolCallInfo(fbb_, o, at.group_id));
    calls = fbb_.CreateVector(cv);
  }
  wire::WorkItemBuilder b(fbb_);
  b.add_work_id(work_id);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_stream_tokens(stream);
  if (!forced_ids.IsNull()) b.add_forced_ids(forced_ids);
  if (!context.IsNull()) b.add_context_ids(context);
  if (!inject.IsNull()) b.add_inject_text(inject);
  if (turn != nullptr) b.add_sampled_before(turn->sampled_before);
  b.add_request_key(key);
  if (!ctx_lps.IsNull()) b.add_context_logprobs(ctx_lps);
  if (!ctx_mask.IsNull()) b.add_context_mask(ctx_mask);
  if (!ctx_versions.IsNull()) b.add_context_versions(ctx_versions);
  if (!calls.IsNull()) b.add_tool_calls(calls);
  if (turn != nullptr) b.add_turn(turn->turn);
  items_.push_back(b.Finish());
}

std::string_view ReplicaWorkBuilder::Finish() {
  auto items = fbb_.CreateVector(items_);
  auto requests = fbb_.CreateVector(requests_);
  flatbuffers::Offset<flatbuffers::Vector<uint64_t>> forget;
  if (!forget_.empty()) forget = fbb_.CreateVector(forget_);
  auto work = wire::CreateReplicaWork(fbb_, items, requests, forget);
  FinishEnvelope(fbb_, 0, wire::Message_ReplicaWork, work.Union());
  return BufferView(fbb_);
}

}  // namespace bitroll::rollout
