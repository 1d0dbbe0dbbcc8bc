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

  // Sets the bound variables. False, after saying why on stderr, on an unknown flag, a missing
  // value or a value that is not an integer.
  bool Parse(const char* program, int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
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
