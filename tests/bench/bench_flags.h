// tests/bench/bench_flags.h: command-line flags of the benchmark programs: "--name value" pairs
// bound to string or int variables, and bare "--name" switches bound to bools. Header-only.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace bitroll::bench {

struct BenchFlags {
  std::map<std::string, std::string*> strings;
  std::map<std::string, int*> ints;
  std::map<std::string, bool*> switches;
  // The usage text (optional): printed on stdout for --help or -h, on stderr after a usage error.
  std::string usage;
  // Set by Parse when it met --help or -h.
  bool help = false;

  // Sets the bound variables. False, after saying why on stderr, on an unknown flag, a missing
  // value or a value that is not an integer; false with `help` set after printing the usage for
  // --help or -h. Callers exit with ExitStatus() then: 0 for help, 2 for a usage error.
  bool Parse(const char* program, int argc, char** argv) {
    const bool ok = ParseFlags(program, argc, argv);
    if (!ok) std::fputs(Usage(program).c_str(), help ? stdout : stderr);
    return ok;
  }
  // `usage`, or one made from the bound flags when it is empty.
  std::string Usage(const char* program) const {
    if (!usage.empty()) return usage;
    std::string u = std::string("usage: ") + program;
    for (const auto& [name, _] : strings) u += " [" + name + " S]";
    for (const auto& [name, _] : ints) u += " [" + name + " N]";
    for (const auto& [name, _] : switches) u += " [" + name + "]";
    return u + "\n(what they mean: the comment at the top of its source)\n";
  }
  int ExitStatus() const { return help ? 0 : 2; }

 private:
  bool ParseFlags(const char* program, int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      if (f == "--help" || f == "-h") {
        help = true;
        return false;
      }
      if (auto s = switches.find(f); s != switches.end()) {
        *s->second = true;
        continue;
      }
      const bool is_string = strings.count(f) != 0, is_int = ints.count(f) != 0;
      if (!is_string && !is_int) {
        std::fprintf(stderr, "%s: unknown flag %s\n", program, f.c_str());
        return false;
      }
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", program, f.c_str());
        return false;
      }
      const char* v = argv[++i];
      if (is_string) {
        *strings.at(f) = v;
        continue;
      }
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end == v || *end != '\0') {
        std::fprintf(stderr, "%s: %s wants an integer, got '%s'\n", program, f.c_str(), v);
        return false;
      }
      *ints.at(f) = static_cast<int>(n);
    }
    return true;
  }
};

}  // namespace bitroll::bench
