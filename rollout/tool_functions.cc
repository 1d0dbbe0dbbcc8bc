#include "rollout/tool_functions.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace bitroll::rollout {

namespace {

// Recursive descent over: expr = term {(+|-) term}; term = unary {(*|/) unary};
// unary = - unary | primary; primary = number | ( expr ).
class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Result<double> Parse() {
    BR_ASSIGN_OR_RETURN(double v, Expr(0));
    Skip();
    if (i_ != s_.size()) return Error("unexpected '" + std::string(1, s_[i_]) + "'");
    return v;
  }

 private:
  Status Error(const std::string& why) const {
    return Status::InvalidArgument("calc: " + why + " at offset " + std::to_string(i_));
  }
  void Skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  bool Eat(char c) {
    Skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  Result<double> Expr(int depth) {
    if (depth > 64) return Error("nesting too deep");
    BR_ASSIGN_OR_RETURN(double v, Term(depth));
    while (true) {
      if (Eat('+')) {
        BR_ASSIGN_OR_RETURN(double r, Term(depth));
        v += r;
      } else if (Eat('-')) {
        BR_ASSIGN_OR_RETURN(double r, Term(depth));
        v -= r;
      } else {
        break;
      }
      if (!std::isfinite(v)) return Error("overflow");
    }
    return v;
  }
  Result<double> Term(int depth) {
    BR_ASSIGN_OR_RETURN(double v, Unary(depth));
    while (true) {
      if (Eat('*')) {
        BR_ASSIGN_OR_RETURN(double r, Unary(depth));
        v *= r;
      } else if (Eat('/')) {
        BR_ASSIGN_OR_RETURN(double r, Unary(depth));
        if (r == 0.0) return Error("division by zero");
        v /= r;
      } else {
        break;
      }
      if (!std::isfinite(v)) return Error("overflow");
    }
    return v;
  }
  Result<double> Unary(int depth) {
    if (depth > 64) return Error("nesting too deep");
    if (Eat('-')) {
      BR_ASSIGN_OR_RETURN(double v, Unary(depth + 1));
      return -v;
    }
    if (Eat('+')) return Unary(depth + 1);
    return Primary(depth);
  }
  Result<double> Primary(int depth) {
    if (Eat('(')) {
      BR_ASSIGN_OR_RETURN(double v, Expr(depth + 1));
      if (!Eat(')')) return Error("missing ')'");
      return v;
    }
    Skip();
    const size_t start = i_;
    bool dot = false;
    while (i_ < s_.size() && ((s_[i_] >= '0' && s_[i_] <= '9') || (s_[i_] == '.' && !dot))) {
      dot = dot || s_[i_] == '.';
      ++i_;
    }
    if (i_ == start || (i_ == start + 1 && dot)) {
      return Error(i_ < s_.size() ? "expected a number, got '" + std::string(1, s_[i_]) + "'"
                                  : "expected a number at the end");
    }
    const std::string num(s_.substr(start, i_ - start));
    const double v = std::strtod(num.c_str(), nullptr);
    if (!std::isfinite(v)) return Error("number out of range");
    return v;
  }

  std::string_view s_;
  size_t i_ = 0;
};

std::string EnvValue(const sandbox::Request& r, std::string_view key) {
  for (const std::string& kv : r.env) {
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=') {
      return kv.substr(key.size() + 1);
    }
  }
  return "";
}

}  // namespace

bool IsToolFunction(std::string_view name) {
  return name == "echo" || name == "calc" || name == "append";
}

Result<std::string> EvaluateArithmetic(std::string_view expression) {
  Parser p(expression);
  BR_ASSIGN_OR_RETURN(double v, p.Parse());
  char buf[64];
  if (std::fabs(v) < 9.0e15 && v == std::floor(v)) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof(buf), "%.12g", v);
  }
  return std::string(buf);
}

Status RegisterToolFunctions(sandbox::Sandbox& sb, const ToolFunctionOptions& options) {
  BR_RETURN_IF_ERROR(sb.Register("echo",
                                 [](const sandbox::Request& r, sandbox::FunctionOutput* out) {
                                   out->stdout_data = r.stdin_data;
                                 },
                                 {.run_inline = false}));
  BR_RETURN_IF_ERROR(
      sb.Register("calc", [](const sandbox::Request& r, sandbox::FunctionOutput* out) {
        Result<std::string> v = EvaluateArithmetic(r.stdin_data);
        if (v.ok()) {
          out->stdout_data = *v;
        } else {
          out->exit_code = 1;
          out->stderr_data = v.status().message();
        }
      }));
  struct AppendState {
    std::mutex mu;
    uint64_t count = 0;
  };
  auto st = std::make_shared<AppendState>();
  const std::string file = options.append_file;
  const int delay = options.append_delay_ms;
  BR_RETURN_IF_ERROR(sb.Register(
      "append", [st, file, delay](const sandbox::Request& r, sandbox::FunctionOutput* out) {
        if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        if (file.empty()) {
          out->exit_code = 1;
          out->stderr_data = "append: the service has no --tool-append-file";
          return;
        }
        std::string input = r.stdin_data;
        for (char& c : input) {
          if (c == '\n' || c == '\r') c = ' ';
        }
        const std::string line =
            EnvValue(r, "BITROLL_GROUP") + " " + EnvValue(r, "BITROLL_PROMPT") + " " +
            EnvValue(r, "BITROLL_SAMPLE") + " " + EnvValue(r, "BITROLL_CALL") + " " + input + "\n";
        std::lock_guard<std::mutex> l(st->mu);
        const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
          out->exit_code = 1;
          out->stderr_data = "append: open " + file + ": " + std::strerror(errno);
          return;
        }
        const ssize_t n = ::write(fd, line.data(), line.size());
        ::close(fd);
        if (n != static_cast<ssize_t>(line.size())) {
          out->exit_code = 1;
          out->stderr_data = "append: short write";
          return;
        }
        ++st->count;
        out->stdout_data = "ok";  // deterministic: replay and re-execution inject the same text
      }));
  return Status::Ok();
}

}  // namespace bitroll::rollout
