#include "rollout/messages.h"

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

// `head` then `tail` (may be null), written straight into the builder (no temporary vector).
template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> ConcatVector(flatbuffers::FlatBufferBuilder& fbb,
                                                         std::span<const T> head,
                                                         const flatbuffers::Vector<T>* tail) {
  const size_t n = tail ? tail->size() : 0;
  T* out = nullptr;
  auto off = fbb.CreateUninitializedVector(head.size() + n, &out);
  if (!head.empty()) std::memcpy(out, head.data(), head.size() * sizeof(T));
  if (n > 0) std::memcpy(out + head.size(), tail->data(), n * sizeof(T));
  return off;
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

void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const wire::Trajectory& t,
                           const SampleAddress& at, const Cost& cost, std::string_view replica,
                           const flatbuffers::String* client_tag, const TurnPrefix* prefix,
                           bool wal_bytes_slot) {
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> ids;
  flatbuffers::Offset<flatbuffers::Vector<float>> lps;
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> mask;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::ToolCallInfo>>> calls;
  std::vector<wire::VersionSpan> spans;
  const size_t n = t.ids() ? t.ids()->size() : 0;
  int32_t turns = t.turns();
  if (prefix != nullptr) {
    ids = ConcatVector(fbb, prefix->ids, t.ids());
    lps = ConcatVector(fbb, prefix->lps, t.logprobs());
    uint8_t* m = nullptr;  // the earlier turns' mask, then 1 for each of t's (sampled) tokens
    mask = fbb.CreateUninitializedVector(prefix->mask.size() + n, &m);
    if (!prefix->mask.empty()) std::memcpy(m, prefix->mask.data(), prefix->mask.size());
    if (n > 0) std::memset(m + prefix->mask.size(), 1, n);
    spans.assign(prefix->versions.begin(), prefix->versions.end());
    if (t.versions()) {  // the replica's spans begin at trajectory indexes, like the prefix's
      for (const wire::VersionSpan* v : *t.versions()) {
        if (!spans.empty() && spans.back().version() == v->version()) continue;
        spans.push_back(*v);
      }
    }
    std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
    for (const ToolOutcome& o : prefix->calls) cv.push_back(BuildToolCallInfo(fbb, o, at.group_id));
    calls = fbb.CreateVector(cv);
    turns = prefix->turns;
  } else {
    ids = CopyVector(fbb, t.ids());
    lps = CopyVector(fbb, t.logprobs());
    if (t.mask()) {
      mask = CopyVector(fbb, t.mask());
    } else {
      std::vector<uint8_t> ones(n, 1);
      mask = fbb.CreateVector(ones);
    }
    if (t.versions()) {
      for (const wire::VersionSpan* v : *t.versions()) spans.push_back(*v);
    }
    if (t.tool_calls() && t.tool_calls()->size() > 0) {
      std::vector<flatbuffers::Offset<wire::ToolCallInfo>> cv;
      for (const wire::ToolCallInfo* c : *t.tool_calls()) cv.push_back(CopyToolCallInfo(fbb, *c));
      calls = fbb.CreateVector(cv);
    }
  }
  auto vs = fbb.CreateVectorOfStructs(spans);
  // The routing record of the last turn covers the whole trajectory (its engine prompt holds every
  // earlier turn). A malformed one from a replica is dropped, not forwarded.
  flatbuffers::Offset<wire::Routing> routing;
  if (t.routing()) {
    if (Result<RoutingRecord> r = RoutingFromWire(t.routing()); r.ok()) {
      routing = RoutingToWire(fbb, *r);
    }
  }
  flatbuffers::Offset<wire::Fingerprint> fp;
  if (const auto* f = t.fingerprint()) fp = FingerprintToWire(fbb, FingerprintFromWire(f));
  fbb.ForceDefaults(wal_bytes_slot);
  auto c = CostToWire(fbb, cost);
  fbb.ForceDefaults(false);
  auto rep = fbb.CreateString(replica.data(), replica.size());
  flatbuffers::Offset<flatbuffers::String> tag;
  if (client_tag) tag = fbb.CreateString(client_tag);
  flatbuffers::Offset<wire::Error> err;
  if (const auto* e = t.error()) {
    err = wire::CreateError(fbb, e->code(),
                            fbb.CreateString(e->message() ? e->message()->str() : ""), at.group_id);
  }
  wire::TrajectoryBuilder b(fbb);
  b.add_group_id(at.group_id);
  b.add_prompt_index(at.prompt_index);
  b.add_sample_index(at.sample_index);
  b.add_ids(ids);
  b.add_logprobs(lps);
  b.add_finish(t.finish());
  b.add_turns(turns);
  b.add_versions(vs);
  if (!fp.IsNull()) b.add_fingerprint(fp);
  b.add_cost(c);
  b.add_replica(rep);
  if (!tag.IsNull()) b.add_client_tag(tag);
  if (!err.IsNull()) b.add_error(err);
  b.add_mask(mask);
  if (!calls.IsNull()) b.add_tool_calls(calls);
  if (!routing.IsNull()) b.add_routing(routing);
  auto off = b.Finish();
  FinishEnvelope(fbb, 0, wire::Message_Trajectory, off.Union());
}

bool SetTrajectoryWalBytes(std::string& envelope, int64_t wal_bytes) {
  flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(envelope.data()), envelope.size());
  if (!wire::VerifyEnvelopeBuffer(v)) return false;  // not an envelope at all
  const wire::Trajectory* t = wire::GetEnvelope(envelope.data())->msg_as_Trajectory();
  if (t == nullptr || t->cost() == nullptr) return false;
  // The generated code has no mutators (flatc without --gen-mutable); wire::Cost is a
  // flatbuffers::Table, whose SetField overwrites a stored scalar in place.
  auto* cost = reinterpret_cast<flatbuffers::Table*>(const_cast<wire::Cost*>(t->cost()));
  return cost->SetField<int64_t>(wire::Cost::VT_WAL_BYTES, wal_bytes);
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
