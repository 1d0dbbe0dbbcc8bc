// rollout/tool_functions.h: the built-in function-tier tools of `bitroll serve`.
//
// Registered on the service's sandbox (sandbox::Sandbox::Register) by RegisterToolFunctions():
//   echo    stdout = the input.
//   calc    integer/decimal arithmetic: + - * / ( ), unary minus, decimal numbers. stdout = the
//           value (integers printed without a fraction, others with up to 12 significant digits).
//           A malformed expression, division by zero or overflow exits 1 with the reason on
//           stderr (the caller sees exit_status 1 and the typed error text).
//   append  appends one line "GROUP PROMPT SAMPLE CALL INPUT\n" (from the run's environment:
//           BITROLL_GROUP, BITROLL_PROMPT, BITROLL_SAMPLE, BITROLL_CALL) to
//           ToolFunctionOptions::append_file with one O_APPEND write, after sleeping
//           append_delay_ms; stdout = "ok" (a pure function of the input, as every tool must
//           be for bit-identical trajectories across an at-least-once re-run). A file
//           outside any sandbox's view: tests count executions with it. Without a file the
//           call exits 1 ("no --tool-append-file").
// Every tool receives the call's input as Request::stdin_data.
//
// Thread-safety: the handlers are thread-safe (append serializes its writes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sandbox/sandbox.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct ToolFunctionOptions {
  std::string append_file;  // `bitroll serve --tool-append-file PATH`
  int append_delay_ms = 0;  // `--tool-append-delay-ms N`: makes calls slow (crash tests)
};

// Names of the built-in functions, for request validation.
bool IsToolFunction(std::string_view name);

Status RegisterToolFunctions(sandbox::Sandbox& sandbox, const ToolFunctionOptions& options);

// calc's evaluator. Errors: kInvalidArgument (syntax, division by zero, overflow).
Result<std::string> EvaluateArithmetic(std::string_view expression);

}  // namespace bitroll::rollout
