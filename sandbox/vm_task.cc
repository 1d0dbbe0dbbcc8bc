#include "sandbox/vm_task.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace bitroll::sandbox {
namespace {

void Pad4(std::string* out) {
  while (out->size() % 4 != 0) out->push_back('\0');
}

std::string Hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08X", v);
  return buf;
}

}  // namespace

void AppendCpioEntry(const std::string& name, uint32_t mode, const std::string& data,
                     std::string* out) {
  static std::atomic<uint32_t> ino{0x7000};
  const bool regular = (mode & 0170000) == 0100000;
  const uint32_t fields[13] = {ino++,
                               mode,
                               0,
                               0,
                               1,
                               0,
                               regular ? static_cast<uint32_t>(data.size()) : 0u,
                               0,
                               0,
                               0,
                               0,
                               static_cast<uint32_t>(name.size() + 1),
                               0};
  out->append("070701");
  for (uint32_t f : fields) out->append(Hex8(f));
  out->append(name);
  out->push_back('\0');
  Pad4(out);
  if (regular) {
    out->append(data);
    Pad4(out);
  }
}

void AppendCpioTrailer(std::string* out) {
  AppendCpioEntry("TRAILER!!!", 0, "", out);
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

std::string BuildVmInitrd(const std::string& base, const Request& request) {
  const Limits& l = request.limits;
  std::string run;
  for (const std::string& e : request.env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    run += "export " + e.substr(0, eq) + "=" + ShellQuote(e.substr(eq + 1)) + "\n";
  }
  run += "exec";
  for (const std::string& a : request.argv) run += " " + ShellQuote(a);
  run += "\n";
  char limits[512];
  std::snprintf(limits, sizeof(limits),
                "WALL=%.3f\nCPU=%lld\nMEMKB=%llu\nNPROC=%u\nOUTB=%llu\nFILEB=%llu\n",
                l.wall_seconds, static_cast<long long>(std::ceil(l.cpu_seconds)),
                static_cast<unsigned long long>(l.memory_bytes / 1024), l.max_processes,
                static_cast<unsigned long long>(l.max_output_bytes),
                static_cast<unsigned long long>(l.max_file_bytes));
  std::string outputs;
  for (const std::string& n : request.output_files) outputs += n + "\n";

  std::string out = base;
  Pad4(&out);
  AppendCpioEntry("task", 040755, "", &out);
  AppendCpioEntry("task/files", 040755, "", &out);
  AppendCpioEntry("task/run.sh", 0100644, run, &out);
  AppendCpioEntry("task/limits", 0100644, limits, &out);
  AppendCpioEntry("task/stdin", 0100644, request.stdin_data, &out);
  AppendCpioEntry("task/outputs", 0100644, outputs, &out);
  for (const auto& [name, data] : request.files) {
    AppendCpioEntry("task/files/" + name, 0100644, data, &out);
  }
  AppendCpioTrailer(&out);
  return out;
}

bool Base64Decode(const std::string& in, std::string* out) {
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+')
      v = 62;
    else if (c == '/')
      v = 63;
    else if (c == '=' || c == '\n' || c == '\r' || c == ' ')
      continue;
    else
      return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

bool ParseVmConsole(const std::string& console, const Request& request, RunResult* r) {
  size_t begin = console.find("@@BITROLL-BEGIN@@");
  if (begin == std::string::npos) return false;
  size_t end = console.find("@@BITROLL-END@@", begin);
  if (end == std::string::npos) return false;
  std::istringstream in(console.substr(begin, end - begin));
  std::string line;
  std::getline(in, line);  // the marker
  int rc = -1;
  bool timedout = false;
  auto read_blob = [&](std::string* data) -> bool {
    std::string b64;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line == "@@") return Base64Decode(b64, data);
      b64 += line;
    }
    return false;
  };
  const uint64_t out_cap = request.limits.max_output_bytes;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "rc") {
      ls >> rc;
    } else if (key == "timedout") {
      int t = 0;
      ls >> t;
      timedout = t != 0;
    } else if (key == "stdout" || key == "stderr") {
      std::string data;
      if (!read_blob(&data)) return false;
      bool trunc = data.size() > out_cap;
      if (trunc) data.resize(out_cap);
      if (key == "stdout") {
        r->stdout_data = std::move(data);
        r->stdout_truncated = trunc;
      } else {
        r->stderr_data = std::move(data);
        r->stderr_truncated = trunc;
      }
    } else if (key == "file") {
      std::string name;
      ls >> name;
      OutputFile f;
      if (!read_blob(&f.data)) return false;
      if (f.data.size() > request.limits.max_file_bytes) {
        f.data.resize(request.limits.max_file_bytes);
        f.truncated = true;
      }
      r->files[name] = std::move(f);
    }
  }
  if (rc < 0) return false;
  // The guest's shell reports a signal as 128 + its number.
  if (rc > 128 && rc <= 128 + 64) {
    r->exited = false;
    r->term_signal = rc - 128;
  } else {
    r->exited = true;
    r->exit_code = rc;
  }
  if (timedout) {
    r->error = SandboxError::kTimeout;
  } else if (r->stdout_truncated || r->stderr_truncated) {
    r->error = SandboxError::kOutputLimit;
  } else if (!r->exited && r->term_signal == SIGXCPU) {
    r->error = SandboxError::kCpuTime;
  }
  return true;
}

}  // namespace bitroll::sandbox
