#include "rollout/protocol.h"

#include <cmath>
#include <cstdio>
#include <cstring>

namespace bitroll::rollout {

Result<const wire::Envelope*> DecodeEnvelope(const void* data, size_t size,
                                             const DecodeLimits& limits) {
  if (size > limits.max_message_bytes) {
    return Status::ResourceExhausted("message of " + std::to_string(size) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(limits.max_message_bytes));
  }
  if (data == nullptr || size < 8) {
    return Status::Protocol("message of " + std::to_string(size) + " bytes is too short");
  }
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (!flatbuffers::BufferHasIdentifier(bytes, wire::EnvelopeIdentifier())) {
    return Status::Protocol("message lacks the BRL1 file identifier");
  }
  flatbuffers::Verifier verifier(bytes, size, limits.max_depth, limits.max_tables);
  if (!wire::VerifyEnvelopeBuffer(verifier)) {
    return Status::Protocol("message fails the FlatBuffers verifier");
  }
  const wire::Envelope* env = wire::GetEnvelope(bytes);
  if (env->protocol_version() != kProtocolVersion) {
    return Status::Protocol("protocol version " + std::to_string(env->protocol_version()) +
                            " is not supported (this build speaks " +
                            std::to_string(kProtocolVersion) + ")");
  }
  const auto type = env->msg_type();
  if (type == wire::Message_NONE || type > wire::Message_MAX || env->msg() == nullptr) {
    return Status::Protocol("unknown message type " + std::to_string(static_cast<int>(type)));
  }
  return env;
}

const void* AlignForRead(const void* data, size_t size, std::vector<uint64_t>* storage) {
  if (reinterpret_cast<uintptr_t>(data) % 8 == 0) return data;
  storage->resize((size + 7) / 8);
  if (size > 0) std::memcpy(storage->data(), data, size);
  return storage->data();
}

namespace {

Status CheckIds(const flatbuffers::Vector<int32_t>* ids, int32_t vocab, const char* what,
                uint32_t index) {
  if (ids == nullptr) return Status::Ok();
  for (flatbuffers::uoffset_t k = 0; k < ids->size(); ++k) {
    const int32_t id = ids->Get(k);
    if (id < 0 || (vocab > 0 && id >= vocab)) {
      return Status::OutOfRange(std::string(what) + " " + std::to_string(index) + ": token id " +
                                std::to_string(id) + " at " + std::to_string(k) +
                                " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateSubmit(const wire::SubmitRollouts& m, const SubmitLimits& limits) {
  const auto* prompts = m.prompts();
  if (prompts == nullptr || prompts->size() == 0) {
    return Status::InvalidArgument("SubmitRollouts has no prompts");
  }
  if (prompts->size() > limits.max_prompts) {
    return Status::InvalidArgument("SubmitRollouts has " + std::to_string(prompts->size()) +
                                   " prompts; the limit is " + std::to_string(limits.max_prompts));
  }
  if (m.n() == 0 || m.n() > limits.max_n) {
    return Status::InvalidArgument("n = " + std::to_string(m.n()) + " is outside [1, " +
                                   std::to_string(limits.max_n) + "]");
  }
  const uint64_t samples = uint64_t{prompts->size()} * m.n();
  if (samples > limits.max_samples) {
    return Status::InvalidArgument("group of " + std::to_string(samples) +
                                   " samples exceeds the limit of " +
                                   std::to_string(limits.max_samples));
  }
  if (m.max_tokens() < 1 || m.max_tokens() > limits.max_tokens) {
    return Status::InvalidArgument("max_tokens = " + std::to_string(m.max_tokens()) +
                                   " is outside [1, " + std::to_string(limits.max_tokens) + "]");
  }
  if (m.max_turns() < 1 || m.max_turns() > limits.max_turns) {
    return Status::InvalidArgument("max_turns = " + std::to_string(m.max_turns()) +
                                   " is outside [1, " + std::to_string(limits.max_turns) + "]");
  }
  BR_RETURN_IF_ERROR(ValidateSamplingParams(SamplingFromWire(m)));
  for (uint32_t i = 0; i < prompts->size(); ++i) {
    const wire::Prompt* p = prompts->Get(i);
    const bool has_ids = p->ids() != nullptr;
    const bool has_text = p->text() != nullptr;
    if (has_ids == has_text) {
      return Status::InvalidArgument("prompt " + std::to_string(i) +
                                     " must set exactly one of ids and text");
    }
    const size_t len = has_ids ? p->ids()->size() : p->text()->size();
    if (len == 0) return Status::InvalidArgument("prompt " + std::to_string(i) + " is empty");
    if (len > limits.max_prompt_tokens) {
      return Status::InvalidArgument("prompt " + std::to_string(i) + " has " + std::to_string(len) +
                                     " elements; the limit is " +
                                     std::to_string(limits.max_prompt_tokens));
    }
    BR_RETURN_IF_ERROR(CheckIds(p->ids(), limits.vocab_size, "prompt", i));
    if (has_ids && limits.max_seq_len > 0 && len >= static_cast<size_t>(limits.max_seq_len)) {
      return Status::OutOfRange("prompt " + std::to_string(i) + " has " + std::to_string(len) +
                                " tokens; the model's context holds " +
                                std::to_string(limits.max_seq_len) +
                                " (a prompt must leave room for one generated token)");
    }
  }
  BR_RETURN_IF_ERROR(CheckIds(m.stop_ids(), limits.vocab_size, "stop_ids", 0));
  return ValidateTools(m);
}

Status ValidateTools(const wire::SubmitRollouts& m) {
  if (const auto* ss = m.stop_strings()) {
    for (const auto* s : *ss) {
      if (s->size() == 0) return Status::InvalidArgument("stop_strings holds an empty string");
    }
  }
  const bool open_s = m.tool_open() && m.tool_open()->size() > 0;
  const bool close_s = m.tool_close() && m.tool_close()->size() > 0;
  const bool open_i = m.tool_open_id() >= 0, close_i = m.tool_close_id() >= 0;
  if (open_s != close_s) {
    return Status::InvalidArgument("set both tool_open and tool_close, or neither");
  }
  if (open_i != close_i) {
    return Status::InvalidArgument("set both tool_open_id and tool_close_id, or neither");
  }
  if (open_s && open_i) {
    return Status::InvalidArgument("tool delimiters: strings or token ids, not both");
  }
  if (m.tool_open_id() < -1 || m.tool_close_id() < -1) {
    return Status::InvalidArgument("tool_open_id / tool_close_id must be >= 0 (or -1: none)");
  }
  const auto* tools = m.tools();
  const bool has_tools = tools != nullptr && tools->size() > 0;
  if (has_tools != (open_s || open_i)) {
    return Status::InvalidArgument(
        has_tools ? "tools need delimiters: tool_open/tool_close or tool_open_id/tool_close_id"
                  : "tool delimiters given without tools");
  }
  if (m.tool_result_template() && m.tool_result_template()->size() > 0 &&
      m.tool_result_template()->string_view().find("{output}") == std::string_view::npos) {
    return Status::InvalidArgument("tool_result_template lacks \"{output}\"");
  }
  if (!has_tools) return Status::Ok();
  for (uint32_t i = 0; i < tools->size(); ++i) {
    const wire::ToolSpec* t = tools->Get(i);
    const std::string name = t->name()->str();
    if (name.empty() || name.find_first_of(" \t\n\r") != std::string::npos) {
      return Status::InvalidArgument("tool " + std::to_string(i) +
                                     ": a name is one non-empty word");
    }
    for (uint32_t j = 0; j < i; ++j) {
      if (tools->Get(j)->name()->string_view() == name) {
        return Status::InvalidArgument("tool name " + name + " is given twice");
      }
    }
    if (t->tier() > wire::ToolTier_MAX) {
      return Status::InvalidArgument("tool " + name + " has an unknown tier " +
                                     std::to_string(static_cast<int>(t->tier())));
    }
    if (t->tier() == wire::ToolTier_Function) {
      if (t->function() == nullptr || t->function()->size() == 0) {
        return Status::InvalidArgument("tool " + name + " (function tier) names no function");
      }
      const std::string_view f = t->function()->string_view();
      if (f != "echo" && f != "calc" && f != "append") {
        return Status::InvalidArgument("tool " + name + ": function '" + std::string(f) +
                                       "' is not registered (built-in: echo, calc, append)");
      }
    } else {
      if (t->command_template() == nullptr ||
          t->command_template()->string_view().find("{input}") == std::string_view::npos) {
        return Status::InvalidArgument("tool " + name + ": the command template of a " +
                                       wire::EnumNameToolTier(t->tier()) +
                                       "-tier tool must contain \"{input}\"");
      }
    }
    if (const wire::ToolLimits* l = t->limits()) {
      if (l->wall_ms() == 0 || l->wall_ms() > 86400000u || l->cpu_ms() == 0 ||
          l->cpu_ms() > 86400000u) {
        return Status::InvalidArgument("tool " + name +
                                       ": wall_ms and cpu_ms must be in [1, 86400000]");
      }
      if (l->memory_bytes() < (1u << 20) || l->processes() == 0 || l->output_bytes() == 0) {
        return Status::InvalidArgument(
            "tool " + name + ": memory_bytes >= 1 MiB, processes >= 1, output_bytes >= 1");
      }
    }
  }
  return Status::Ok();
}

Status CheckMessage(const void* data, size_t size, const DecodeLimits& decode,
                    const SubmitLimits& submit) {
  BR_ASSIGN_OR_RETURN(const wire::Envelope* env, DecodeEnvelope(data, size, decode));
  switch (env->msg_type()) {
    case wire::Message_SubmitRollouts:
      return ValidateSubmit(*env->msg_as_SubmitRollouts(), submit);
    case wire::Message_UpdateWeights: {
      const auto* u = env->msg_as_UpdateWeights();
      if (u->path() == nullptr || u->path()->size() == 0) {
        return Status::InvalidArgument("UpdateWeights: no path");
      }
      return Status::Ok();
    }
    default:
      return Status::Ok();
  }
}

const wire::GroupRequest* FindRequest(const wire::ReplicaWork& work, uint64_t key) {
  if (work.requests() == nullptr) return nullptr;
  for (const wire::GroupRequest* r : *work.requests()) {
    if (r->key() == key) return r;
  }
  return nullptr;
}

Result<const wire::SubmitRollouts*> SubmitOf(const wire::Envelope* request,
                                             const wire::WorkItem& item) {
  const wire::SubmitRollouts* m = request ? request->msg_as_SubmitRollouts() : nullptr;
  if (m == nullptr || m->prompts() == nullptr) {
    return Status::Protocol("request " + std::to_string(item.request_key()) +
                            " holds no SubmitRollouts");
  }
  if (item.prompt_index() >= m->prompts()->size()) {
    return Status::Protocol("work item " + std::to_string(item.work_id()) + ": prompt " +
                            std::to_string(item.prompt_index()) + " of a request with " +
                            std::to_string(m->prompts()->size()));
  }
  return m;
}

Result<const wire::SubmitRollouts*> RequestOf(const wire::ReplicaWork& work,
                                              const wire::WorkItem& item) {
  const wire::GroupRequest* r = FindRequest(work, item.request_key());
  if (r == nullptr) {
    return Status::Protocol("work item " + std::to_string(item.work_id()) + " names request " +
                            std::to_string(item.request_key()) + ", which its message (of " +
                            std::to_string(work.requests() ? work.requests()->size() : 0) +
                            " requests) does not carry");
  }
  return SubmitOf(r->envelope() && r->envelope()->size() > 0 ? r->envelope_nested_root() : nullptr,
                  item);
}

Status CheckReplicaHello(const wire::ReplicaHello& hello) {
  const uint32_t v = hello.replica_protocol() == 0 ? 1 : hello.replica_protocol();
  if (v == kReplicaProtocolVersion) return Status::Ok();
  return Status::Protocol("replica protocol version " + std::to_string(v) +
                          " is not supported (this coordinator speaks " +
                          std::to_string(kReplicaProtocolVersion) + ")");
}

void FinishEnvelope(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, wire::Message type,
                    flatbuffers::Offset<void> msg, std::string_view client_id) {
  auto id = client_id.empty() ? 0 : fbb.CreateString(client_id.data(), client_id.size());
  auto env = wire::CreateEnvelope(fbb, kProtocolVersion, request_id, type, msg, id);
  wire::FinishEnvelopeBuffer(fbb, env);
}

std::string EncodeError(uint64_t request_id, const Status& status, uint64_t group_id) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto err = ErrorToWire(fbb, status, group_id);
  FinishEnvelope(fbb, request_id, wire::Message_Error, err.Union());
  return std::string(BufferView(fbb));
}

}  // namespace bitroll::rollout
