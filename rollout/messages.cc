#include "rollout/messages.h"

#include <vector>

namespace bitroll::rollout {

namespace {

template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> CopyVector(flatbuffers::FlatBufferBuilder& fbb,
                                                       const flatbuffers::Vector<T>* v) {
  return fbb.CreateVector(v ? v->data() : nullptr, v ? v->size() : 0);
}

}  // namespace

void BuildClientTrajectory(flatbuffers::FlatBufferBuilder& fbb, const wire::Trajectory& t,
                           const SampleAddress& at, const CostInfo& cost, std::string_view replica,
                           const flatbuffers::String* client_tag) {
  auto ids = CopyVector(fbb, t.ids());
  auto lps = CopyVector(fbb, t.logprobs());
  std::vector<wire::VersionSpan> spans;
  if (t.versions()) {
    for (const wire::VersionSpan* v : *t.versions()) spans.push_back(*v);
  }
  auto vs = fbb.CreateVectorOfStructs(spans);
  flatbuffers::Offset<wire::Fingerprint> fp;
  if (const auto* f = t.fingerprint()) {
    fp = wire::CreateFingerprint(fbb, f->weights_hash(), f->kernel_version(), f->attention_chunk(),
                                 fbb.CreateString(f->backend() ? f->backend()->str() : ""));
  }
  auto c = BuildCost(fbb, cost);
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
  b.add_turns(t.turns());
  b.add_versions(vs);
  if (!fp.IsNull()) b.add_fingerprint(fp);
  b.add_cost(c);
  b.add_replica(rep);
  if (!tag.IsNull()) b.add_client_tag(tag);
  if (!err.IsNull()) b.add_error(err);
  auto off = b.Finish();
  FinishEnvelope(fbb, 0, wire::Message_Trajectory, off.Union());
}

void BuildClientTokenChunk(flatbuffers::FlatBufferBuilder& fbb, const wire::TokenChunk& c,
                           const SampleAddress& at) {
  auto ids = CopyVector(fbb, c.ids());
  auto lps = CopyVector(fbb, c.logprobs());
  auto tc = wire::CreateTokenChunk(fbb, at.group_id, at.prompt_index, at.sample_index,
                                   c.position_begin(), ids, lps, c.weight_version(), 0);
  FinishEnvelope(fbb, 0, wire::Message_TokenChunk, tc.Union());
}

flatbuffers::Offset<wire::WorkItem> BuildWorkItem(flatbuffers::FlatBufferBuilder& fbb,
                                                  const wire::SubmitRollouts& m, uint64_t work_id,
                                                  const SampleAddress& at,
                                                  std::span<const int32_t> forced, bool stream) {
  const wire::Prompt* p = m.prompts()->Get(at.prompt_index);
  flatbuffers::Offset<wire::Prompt> prompt;
  if (p->ids()) {
    prompt = wire::CreatePrompt(fbb, CopyVector(fbb, p->ids()));
  } else {
    prompt = wire::CreatePrompt(fbb, 0, fbb.CreateString(p->text()));
  }
  flatbuffers::Offset<wire::SamplingParams> sp;
  if (const auto* s = m.sampling()) {
    sp = wire::CreateSamplingParams(fbb, s->temperature(), s->top_k(), s->top_p(), s->min_p());
  }
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> stop;
  if (m.stop_ids()) stop = CopyVector(fbb, m.stop_ids());
  flatbuffers::Offset<flatbuffers::Vector<int32_t>> forced_ids;
  if (!forced.empty()) forced_ids = fbb.CreateVector(forced.data(), forced.size());
  return wire::CreateWorkItem(fbb, work_id, at.group_id, at.prompt_index, at.sample_index, prompt,
                              sp, m.seed(), m.max_tokens(), stop, m.stop_at_eos(), m.priority(),
                              m.stream_tokens() || stream, forced_ids);
}

}  // namespace bitroll::rollout
