// rollout/cli_args.h: a small command-line parser for the bitroll subcommands.
//
// Accepts "--name value", "--name=value", "-n value" and bare boolean flags ("--json"). Typed
// getters record which names were read; Finish() then reports anything unknown or malformed, so a
// typo is an error rather than a silently ignored option.
//
// Thread-safety: not thread-safe; one per command invocation.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "schema/status.h"

namespace bitroll::rollout {

class CliArgs {
 public:
  // Parses argv[first..argc).
  CliArgs(int argc, char** argv, int first);

  bool Has(const std::string& name) const;
  std::string String(const std::string& name, const std::string& fallback);
  int64_t Int(const std::string& name, int64_t fallback);
  // A decimal integer in [0, 2^64 - 1] (e.g. a seed, a uint64 on the wire). A sign, another base,
  // an empty value or a value past 2^64 - 1 is an error naming the range.
  uint64_t Uint64(const std::string& name, uint64_t fallback);
  double Double(const std::string& name, double fallback);
  bool Bool(const std::string& name);  // present without a value, or =1/true/yes
  // Non-flag arguments, in order.
  const std::vector<std::string>& positional() const { return positional_; }

  // The first problem seen: an unknown flag, a missing value or a malformed number.
  Status Finish() const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;  // given without a value
  std::set<std::string> used_;
  std::vector<std::string> positional_;
  mutable std::string error_;
};

}  // namespace bitroll::rollout
