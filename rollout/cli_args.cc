#include "rollout/cli_args.h"

#include <cerrno>
#include <cstdlib>

namespace bitroll::rollout {

CliArgs::CliArgs(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() < 2 || a[0] != '-') {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      values_[name.substr(0, eq)] = name.substr(eq + 1);
      continue;
    }
    const bool next_is_value =
        i + 1 < argc && (argv[i + 1][0] != '-' ||
                         (argv[i + 1][1] >= '0' && argv[i + 1][1] <= '9') || argv[i + 1][1] == '.');
    if (next_is_value) {
      values_[name] = argv[++i];
    } else {
      flags_.insert(name);
    }
  }
}

bool CliArgs::Has(const std::string& name) const {
  return values_.count(name) != 0 || flags_.count(name) != 0;
}

std::string CliArgs::String(const std::string& name, const std::string& fallback) {
  used_.insert(name);
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  if (flags_.count(name) != 0 && error_.empty()) error_ = "--" + name + " needs a value";
  return fallback;
}

int64_t CliArgs::Int(const std::string& name, int64_t fallback) {
  const std::string v = String(name, "");
  if (v.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') {
    if (error_.empty()) error_ = "--" + name + ": '" + v + "' is not an integer";
    return fallback;
  }
  return x;
}

uint64_t CliArgs::Uint64(const std::string& name, uint64_t fallback) {
  const bool given = values_.count(name) != 0;
  const std::string v = String(name, "");
  if (!given) return fallback;
  // strtoull accepts "-1" (and wraps it to 2^64 - 1) and leading blanks: digits only.
  const bool digits = !v.empty() && v[0] >= '0' && v[0] <= '9';
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = digits ? std::strtoull(v.c_str(), &end, 10) : 0;
  if (!digits || errno != 0 || *end != '\0') {
    if (error_.empty()) {
      error_ = "--" + name + ": '" + v + "' is not an integer in [0, 18446744073709551615]";
    }
    return fallback;
  }
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  return x;
}

double CliArgs::Double(const std::string& name, double fallback) {
  const std::string v = String(name, "");
  if (v.empty()) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0') {
    if (error_.empty()) error_ = "--" + name + ": '" + v + "' is not a number";
    return fallback;
  }
  return x;
}

bool CliArgs::Bool(const std::string& name) {
  used_.insert(name);
  if (flags_.count(name) != 0) return true;
  auto it = values_.find(name);
  if (it == values_.end()) return false;
  return it->second == "1" || it->second == "true" || it->second == "yes";
}

Status CliArgs::Finish() const {
  if (!error_.empty()) return Status::InvalidArgument(error_);
  for (const auto& [name, v] : values_) {
    if (used_.count(name) == 0) return Status::InvalidArgument("unknown option --" + name);
  }
  for (const auto& name : flags_) {
    if (used_.count(name) == 0) return Status::InvalidArgument("unknown option --" + name);
  }
  if (!positional_.empty()) {
    return Status::InvalidArgument("unexpected argument '" + positional_.front() + "'");
  }
  return Status::Ok();
}

}  // namespace bitroll::rollout
