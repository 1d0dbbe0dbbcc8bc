// rollout/cli_test_util.h: runs the `bitroll` executable as a child process in tests (header-only;
// tests only): RunShell(cmd) collects the exit status, stdout and stderr of a shell command line;
// arguments are quoted with sandbox::ShellQuote.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sandbox/vm_task.h"

namespace bitroll::rollout {

struct CmdResult {
  int rc = -1;  // exit status; -1: did not exit (a signal) or could not start
  std::string out, err;
};

using sandbox::ShellQuote;  // one argument of any string, for /bin/sh

// Runs `cmd` with /bin/sh, stdin from /dev/null.
inline CmdResult RunShell(const std::string& cmd) {
  static int calls = 0;
  const std::filesystem::path err =
      std::filesystem::temp_directory_path() /
      ("bitroll_cmd_" + std::to_string(getpid()) + "_" + std::to_string(calls++));
  const std::string line = cmd + " 2>" + ShellQuote(err.string()) + " </dev/null";
  CmdResult r;
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  std::filesystem::remove(err);
  return r;
}

}  // namespace bitroll::rollout
