// rollout/tool_call.h: from a detected call text to a sandbox request, and from a sandbox result
// to the text injected into the trajectory. Pure functions; the coordinator's tool loop
// (coordinator_tools.cc) and its WAL replay use the same ones, so a replayed result is injected
// byte for byte as the executed one was.
//
// Call text -> tool (ResolveCall): the text between the delimiters, with surrounding whitespace
// removed. With exactly one tool in the request the whole text is its argument; with several,
// the first word names the tool and the rest (trimmed) is the argument. An unknown name gives
// a ToolOutcome with kNotFound and nothing is run.
//
// Command tiers (BuildToolRequest): the template is split into argv words on spaces ('...' and
// "..." group words; no escapes, no shell), then "{input}" is replaced inside each word, so the
// model's text is always exactly one argv word (never re-split, never shell-interpreted unless
// the template itself runs `sh -c '...' sh {input}`, where it arrives as "$1"). The input is
// also the command's stdin. Function tier: the input is the handler's stdin_data and argv[0].
// Every run gets BITROLL_GROUP, BITROLL_PROMPT, BITROLL_SAMPLE and BITROLL_CALL in its
// environment.
//
// Result text (ResultText): stdout when the tool ran and exited 0; "error: CODE: message" for a
// typed sandbox error (CODE as schema/status.h's ErrorCodeName, e.g. "timeout"); "error: exit N:
// STDERR" for a non-zero exit (stderr cut to 256 bytes). FormatResult() puts it into the
// request's tool_result_template at every "{output}".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rollout/protocol.h"
#include "sandbox/sandbox.h"
#include "schema/status.h"
#include "wal/wal.h"

namespace bitroll::rollout {

inline constexpr std::string_view kDefaultResultTemplate = "\n<result>{output}</result>\n";

// One call and its result, as carried on the wire (wire::ToolCallInfo) and in the WAL.
struct ToolOutcome {
  std::string name;  // the tool, or the unknown name the call gave
  std::string input;
  ToolTier tier = ToolTier::kFunction;
  int32_t exit_status = -1;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  Status error;  // typed error of the run; OK when the tool ran to completion (any exit code)
  double wall_seconds = 0, cpu_seconds = 0;
  int32_t token_index = 0;  // index in the trajectory's ids just past the call
  bool replayed = false;    // taken from the WAL, not executed in this process
};

struct ResolvedCall {
  const wire::ToolSpec* spec = nullptr;  // null: unknown tool
  std::string name;
  std::string input;
};

ResolvedCall ResolveCall(const wire::SubmitRollouts& m, std::string_view call_text);

// Splits a command template into words (see the header comment). Errors: kInvalidArgument
// (an unterminated quote, no words).
Result<std::vector<std::string>> SplitTemplate(std::string_view tmpl);

// The environment every tool run gets.
struct CallAddress {
  uint64_t group_id = 0;
  uint32_t prompt_index = 0, sample_index = 0, call_index = 0;
};

Result<sandbox::Request> BuildToolRequest(const wire::ToolSpec& spec, std::string_view input,
                                          const CallAddress& at);

// Fills the outcome's result fields from a sandbox run.
void FillOutcome(const sandbox::RunResult& r, ToolOutcome* out);

std::string ResultText(const ToolOutcome& o);
std::string FormatResult(const wire::SubmitRollouts& m, const ToolOutcome& o);

// WAL conversions. ToolCall/ToolResult carry everything ResultText() reads.
wal::ToolCall ToWalCall(const ToolOutcome& o, uint32_t call_index);
wal::ToolResult ToWalResult(const ToolOutcome& o, uint32_t call_index);
ToolOutcome FromWal(const wal::ToolCallLog& log);  // result fields only when log.result is set

flatbuffers::Offset<wire::ToolCallInfo> BuildToolCallInfo(flatbuffers::FlatBufferBuilder& fbb,
                                                          const ToolOutcome& o, uint64_t group_id);

}  // namespace bitroll::rollout
