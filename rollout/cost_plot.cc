// rollout/cost_plot.cc: see cost_plot.h.
#include "rollout/cost_plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

extern char** environ;

namespace bitroll::rollout {

namespace {

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

std::string Num(double d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", d);
  return buf;
}

}  // namespace

Result<std::string> FindPlotScript() {
  std::vector<std::string> tried;
  if (const char* env = std::getenv("BITROLL_PLOT_SCRIPT"); env != nullptr && *env != '\0') {
    if (access(env, R_OK) == 0) return std::string(env);
    tried.push_back(std::string(env) + " ($BITROLL_PLOT_SCRIPT)");
  }
  const std::string exe = SelfExe();
  if (!exe.empty()) {
    const std::filesystem::path dir = std::filesystem::path(exe).parent_path();
    for (const auto& rel : {"../../scripts/plot_cost.py", "../share/bitroll/plot_cost.py"}) {
      const std::filesystem::path p = (dir / rel).lexically_normal();
      if (access(p.c_str(), R_OK) == 0) return p.string();
      tried.push_back(p.string());
    }
  }
  std::string where;
  for (const std::string& t : tried) where += (where.empty() ? "" : ", ") + t;
  return Status::NotFound("scripts/plot_cost.py not found (looked at " + where +
                          "); set BITROLL_PLOT_SCRIPT");
}

Result<int> RunCostPlot(const std::string& records, const std::string& png,
                        const CostReportOptions& o) {
  BR_ASSIGN_OR_RETURN(std::string script, FindPlotScript());
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  std::vector<std::string> args = {python,
                                   script,
                                   records,
                                   "--out",
                                   png,
                                   "--price-replica-hour",
                                   Num(o.price.replica_hour_usd),
                                   "--price-sandbox-cpu-hour",
                                   Num(o.price.sandbox_cpu_hour_usd),
                                   "--long-context",
                                   std::to_string(o.long_context_tokens)};
  if (const std::string exe = SelfExe(); !exe.empty()) {
    args.push_back("--bitroll");
    args.push_back(exe);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (int rc = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ); rc != 0) {
    return Status::Internal("cannot run " + python + ": " + std::strerror(rc));
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return Status::Internal(std::string("waitpid: ") + std::strerror(errno));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace bitroll::rollout
