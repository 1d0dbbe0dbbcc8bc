#include "rollout/tool_call.h"

#include <algorithm>

namespace bitroll::rollout {

namespace {

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string ReplaceAll(std::string s, std::string_view what, std::string_view with) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + with.size())) {
    s.replace(p, what.size(), with);
  }
  return s;
}

}  // namespace

ResolvedCall ResolveCall(const wire::SubmitRollouts& m, std::string_view call_text) {
  ResolvedCall c;
  const std::string_view text = Trim(call_text);
  const auto* tools = m.tools();
  if (tools == nullptr || tools->size() == 0) {
    c.input = std::string(text);
    return c;
  }
  if (tools->size() == 1) {
    c.spec = tools->Get(0);
    c.name = c.spec->name()->str();
    c.input = std::string(text);
    return c;
  }
  const size_t sp = text.find_first_of(" \t\n\r");
  c.name = std::string(text.substr(0, sp));
  c.input = sp == std::string_view::npos ? std::string() : std::string(Trim(text.substr(sp)));
  for (const wire::ToolSpec* t : *tools) {
    if (t->name()->string_view() == c.name) {
      c.spec = t;
      break;
    }
  }
  return c;
}

Result<std::vector<std::string>> SplitTemplate(std::string_view t) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '\'' || c == '"') {
      const size_t end = t.find(c, i + 1);
      if (end == std::string_view::npos) {
        return Status::InvalidArgument("command template has an unterminated quote");
      }
      cur.append(t.substr(i + 1, end - i - 1));
      in_word = true;
      i = end;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur.push_back(c);
      in_word = true;
    }
  }
  if (in_word) words.push_back(std::move(cur));
  if (words.empty()) return Status::InvalidArgument("command template has no words");
  return words;
}

Result<sandbox::Request> BuildToolRequest(const wire::ToolSpec& spec, std::string_view input,
                                          const CallAddress& at) {
  sandbox::Request r;
  r.tier = TierFromWire(spec.tier());
  r.stdin_data = std::string(input);
  r.env = {"BITROLL_GROUP=" + std::to_string(at.group_id),
           "BITROLL_PROMPT=" + std::to_string(at.prompt_index),
           "BITROLL_SAMPLE=" + std::to_string(at.sample_index),
           "BITROLL_CALL=" + std::to_string(at.call_index)};
  if (spec.tier() == wire::ToolTier_Function) {
    r.function = spec.function() ? spec.function()->str() : "";
    r.argv = {std::string(input)};
  } else {
    if (spec.command_template() == nullptr) {
      return Status::InvalidArgument("tool " + spec.name()->str() + " has no command template");
    }
    BR_ASSIGN_OR_RETURN(std::vector<std::string> words,
                        SplitTemplate(spec.command_template()->string_view()));
    for (std::string& w : words) w = ReplaceAll(std::move(w), "{input}", input);
    r.argv = std::move(words);
  }
  sandbox::Limits& l = r.limits;
  if (const wire::ToolLimits* tl = spec.limits()) {
    l.wall_seconds = tl->wall_ms() / 1000.0;
    l.cpu_seconds = tl->cpu_ms() / 1000.0;
    l.memory_bytes = tl->memory_bytes();
    l.max_output_bytes = tl->output_bytes();
    l.max_processes = tl->processes();
    l.allow_network = tl->network();
  } else {  // the schema's defaults
    l.wall_seconds = 10.0;
    l.cpu_seconds = 10.0;
    l.memory_bytes = 256ull << 20;
    l.max_output_bytes = 65536;
    l.max_processes = 16;
    l.allow_network = false;
  }
  return r;
}

void FillOutcome(const sandbox::RunResult& r, ToolOutcome* o) {
  o->tier = r.tier;
  o->exit_status = r.exited ? r.exit_code : -1;
  o->stdout_data = r.stdout_data;
  o->stderr_data = r.stderr_data;
  o->stdout_truncated = r.stdout_truncated;
  o->stderr_truncated = r.stderr_truncated;
  o->error = r.status;
  if (r.error != sandbox::SandboxError::kNone && o->error.ok()) {
    o->error = Status::Internal(sandbox::SandboxErrorName(r.error));
  }
  o->wall_seconds = r.usage.wall_seconds;
  o->cpu_seconds = r.usage.cpu_seconds;
}

std::string ResultText(const ToolOutcome& o) {
  if (!o.error.ok()) {
    std::string msg = o.error.message();
    if (msg.size() > 256) msg.resize(256);
    return "error: " + std::string(ErrorCodeName(o.error.code())) + ": " + msg;
  }
  if (o.exit_status != 0) {
    std::string err(Trim(o.stderr_data));
    if (err.size() > 256) err.resize(256);
    return "error: exit " + std::to_string(o.exit_status) + ": " + err;
  }
  return o.stdout_data;
}

std::string FormatResult(const wire::SubmitRollouts& m, const ToolOutcome& o) {
  std::string tmpl = m.tool_result_template() && m.tool_result_template()->size() > 0
                         ? m.tool_result_template()->str()
                         : std::string(kDefaultResultTemplate);
  return ReplaceAll(std::move(tmpl), "{output}", ResultText(o));
}

wal::ToolCall ToWalCall(const ToolOutcome& o, uint32_t call_index) {
  wal::ToolCall c;
  c.call_index = call_index;
  c.tool_name = o.name;
  c.tier = o.tier;
  c.input = o.input;
  return c;
}

wal::ToolResult ToWalResult(const ToolOutcome& o, uint32_t call_index) {
  wal::ToolResult r;
  r.call_index = call_index;
  r.exit_status = o.exit_status;
  r.stdout_bytes = o.stdout_data;
  r.stderr_bytes = o.stderr_data;
  r.stdout_truncated = o.stdout_truncated;
  r.stderr_truncated = o.stderr_truncated;
  r.wall_seconds = o.wall_seconds;
  r.cpu_seconds = o.cpu_seconds;
  r.error_code = static_cast<uint16_t>(o.error.code());
  r.error_message = o.error.message();
  return r;
}

ToolOutcome FromWal(const wal::ToolCallLog& log) {
  ToolOutcome o;
  o.name = log.call.tool_name;
  o.input = log.call.input;
  o.tier = log.call.tier;
  o.token_index = static_cast<int32_t>(log.call.token_index);  // both trajectory indexes
  if (log.result) {
    const wal::ToolResult& r = *log.result;
    o.exit_status = r.exit_status;
    o.stdout_data = r.stdout_bytes;
    o.stderr_data = r.stderr_bytes;
    o.stdout_truncated = r.stdout_truncated;
    o.stderr_truncated = r.stderr_truncated;
    o.wall_seconds = r.wall_seconds;
    o.cpu_seconds = r.cpu_seconds;
    o.error = r.error_code == 0 ? Status::Ok()
                                : Status(static_cast<ErrorCode>(r.error_code), r.error_message);
    o.replayed = true;
  }
  return o;
}

flatbuffers::Offset<wire::ToolCallInfo> BuildToolCallInfo(flatbuffers::FlatBufferBuilder& fbb,
                                                          const ToolOutcome& o, uint64_t group_id) {
  auto name = fbb.CreateString(o.name);
  auto input = fbb.CreateString(o.input);
  auto out = fbb.CreateString(o.stdout_data);
  flatbuffers::Offset<wire::Error> err;
  if (!o.error.ok()) {
    err = ErrorToWire(fbb, o.error, group_id);
  }
  return wire::CreateToolCallInfo(fbb, name, input, TierToWire(o.tier), o.exit_status, out,
                                  o.stdout_truncated, err, o.wall_seconds, o.cpu_seconds,
                                  o.token_index, o.replayed);
}

}  // namespace bitroll::rollout
