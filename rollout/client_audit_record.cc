// rollout/client_audit_record.cc: a received trajectory as an audit record
// (rollout/client_audit_record.h).
#include "rollout/client_audit_record.h"

#include <cctype>

#include "rollout/tool_call.h"

namespace bitroll::rollout {

TrajectoryRecord ClientAuditRecord(const TrajectoryResult& t, const SubmitRequest& request) {
  TrajectoryRecord r;
  r.bitroll_version = BitrollVersion();
  r.source = "client";
  r.group_id = t.group_id;
  r.prompt_index = t.prompt_index;
  r.sample_index = t.sample_index;
  if (t.prompt_index < request.prompts.size()) {
    r.prompt_ids = request.prompts[t.prompt_index];
  } else if (t.prompt_index < request.text_prompts.size()) {
    r.prompt_text = request.text_prompts[t.prompt_index];
  }
  r.ids = t.ids;
  r.mask = t.mask.size() == t.ids.size() ? t.mask : std::vector<uint8_t>(t.ids.size(), 1);
  for (size_t i = 0; i < t.ids.size(); ++i) {
    const bool sampled = r.mask[i] != 0 && i < t.logprobs.size();
    r.logprob_bits.push_back(sampled ? FloatBits(t.logprobs[i]) : 0u);
  }
  // A later turn begins where a call's injected result does: the first 0 after a 1.
  r.turn_begins.push_back(0);
  for (size_t i = 1; i < r.mask.size(); ++i) {
    if (r.mask[i] == 0 && r.mask[i - 1] != 0) r.turn_begins.push_back(static_cast<int32_t>(i));
  }
  bool derivable = true;
  for (size_t k = 0; k < t.tool_calls.size(); ++k) {
    const ToolCallResult& c = t.tool_calls[k];
    RecordToolCall o;
    o.call_index = static_cast<uint32_t>(k);
    o.token_index = c.token_index;
    o.name = c.name;
    o.input = c.input;
    o.has_result = true;
    o.exit_status = c.exit_status;
    o.stdout_data = c.output;
    o.error_code = static_cast<int32_t>(c.error.code());
    o.error_message = c.error.message();
    o.error = c.error.ok() ? "" : c.error.ToString();
    derivable = derivable && (!c.error.ok() || c.exit_status == 0);
    r.tool_calls.push_back(std::move(o));
  }
  if (!t.tool_calls.empty() && derivable) {
    r.tool_result_template = request.tool_result_template.empty()
                                 ? std::string(kDefaultResultTemplate)
                                 : request.tool_result_template;
  }
  r.sampling = request;  // SubmitRequest is a SamplingParams (rollout/client.h)
  r.max_tokens = request.max_tokens;
  r.stop_ids = request.stop_ids;
  r.stop_at_eos = request.stop_at_eos;
  r.stop_at_bos = true;  // replicas keep the engine's default
  for (const auto& [begin, version] : t.versions) r.weight_versions.push_back({begin, version});
  if (r.weight_versions.empty()) r.weight_versions.push_back({0, 0});
  r.fingerprint = t.fingerprint;
  std::string finish = FinishReasonName(t.finish);
  for (char& ch : finish) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  r.finish = finish;
  return r;
}

}  // namespace bitroll::rollout
