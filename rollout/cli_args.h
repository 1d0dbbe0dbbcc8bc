// rollout/cli_args.h: the one command-line parser of the bitroll subcommands (CLI11 underneath).
//
// Every subcommand declares its flags on a CliParser, bound to variables that hold the defaults,
// and gets the same behaviour: "--name value" and "--name=value"; --help / -h print the flags on
// stdout; an unknown flag, a missing value, a malformed or out-of-range number and a stray
// argument are one typed error (kInvalidArgument) with one message style. UsageError() prints it
// as "bitroll CMD: WHAT" plus a hint to run `bitroll CMD --help`; the caller exits 2. A flag given
// twice keeps its last value. Numbers take the whole argument: "12x" or "1.5" for an integer is an
// error, never 12 or 1.
//
// Values are applied to their variables after the whole command line parsed, in the order the
// flags were declared (not the order they were given): a flag declared first (`serve --config`)
// can set defaults that the later ones override wherever they appear.
//
// Thread-safety: not thread-safe; one per command invocation. Library code: never exits.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "schema/status.h"

namespace bitroll::rollout {

// Parses all of `text` as a decimal integer of type T (a leading '-' only for signed T). Errors:
// kInvalidArgument "FLAG: 'TEXT' is not an integer in [MIN, MAX]".
template <typename T>
Status ParseIntegerFlag(const std::string& flag, const std::string& text, T* out) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v, 10);
  if (text.empty() || ec != std::errc() || p != end) {
    return Status::InvalidArgument(flag + ": '" + text + "' is not an integer in [" +
                                   std::to_string(std::numeric_limits<T>::min()) + ", " +
                                   std::to_string(std::numeric_limits<T>::max()) + "]");
  }
  *out = v;
  return Status::Ok();
}

// Parses all of `text` as a floating-point number (strtod: also "inf", "nan", "1e-6"). Errors:
// kInvalidArgument "FLAG: 'TEXT' is not a number".
Status ParseDoubleFlag(const std::string& flag, const std::string& text, double* out);

class CliParser {
 public:
  // Applies one flag's text; a non-ok Status is the command's usage error.
  using Setter = std::function<Status(const std::string& value)>;

  // `command` is the subcommand ("serve"); `description` heads --help.
  CliParser(std::string command, std::string description);
  ~CliParser();
  CliParser(const CliParser&) = delete;
  CliParser& operator=(const CliParser&) = delete;

  // Flags declared after this call are listed under `title` in --help ("" = the main list).
  void Group(const std::string& title);
  // Text printed after the flags in --help.
  void Footer(const std::string& text);

  // `names` is CLI11's list: "--model" or "-n,--n"; the first name is used in messages.
  // `value_name` stands for the value in --help ("PATH", "N").
  void String(const std::string& names, std::string* out, const std::string& help,
              const std::string& value_name = "TEXT");
  template <typename T>
  void Integer(const std::string& names, T* out, const std::string& help,
               const std::string& value_name = "N") {
    const std::string flag = FirstName(names);
    Value(names, help, value_name,
          [flag, out](const std::string& v) { return ParseIntegerFlag(flag, v, out); });
  }
  void Double(const std::string& names, double* out, const std::string& help,
              const std::string& value_name = "X");
  // A flag without a value (also --name=true|false|1|0|yes|no).
  void Flag(const std::string& names, bool* out, const std::string& help);
  // A flag with a value and a custom setter.
  void Value(const std::string& names, const std::string& help, const std::string& value_name,
             Setter set);
  // One positional argument (at most one is taken; more are errors).
  void Positional(const std::string& name, std::string* out, const std::string& help);

  // Parses args (the arguments after the subcommand name) and applies every given flag. Errors:
  // kInvalidArgument (see the file comment). After --help nothing is applied and help() is true.
  Status Parse(const std::vector<std::string>& args);
  // Same, for main()'s (argc, argv) where argv[0] is the subcommand name.
  Status Parse(int argc, char** argv);

  bool help() const { return help_; }
  // Whether the flag (any of its names) was given.
  bool Given(const std::string& name) const;
  // The --help text.
  std::string HelpText() const;
  const std::string& command() const { return command_; }

 private:
  struct Impl;
  static std::string FirstName(const std::string& names);

  std::string command_;
  bool help_ = false;
  std::unique_ptr<Impl> impl_;
};

// Prints "bitroll COMMAND: MESSAGE" (the code name too unless kInvalidArgument) and "Run 'bitroll
// COMMAND --help' for its flags." on stderr and returns 2, the exit status of a usage error.
int UsageError(const std::string& command, const Status& s);

// Prints the parser's --help text on stdout and returns 0.
int PrintHelp(const CliParser& p);

}  // namespace bitroll::rollout
