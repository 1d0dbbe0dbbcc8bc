#include "sandbox/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

namespace bitroll::sandbox {
namespace {

constexpr const char* kRoot = "/sys/fs/cgroup";

bool WriteFile(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // v1 memory limits check for pending signals first: retry an interrupted write.
  ssize_t n;
  int tries = 0;
  do {
    n = write(fd, value.data(), value.size());
  } while (n < 0 && errno == EINTR && ++tries < 100);
  const int saved = errno;
  close(fd);
  errno = saved;
  return n == static_cast<ssize_t>(value.size());
}

bool Exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

// The service's own cgroup path for a v1 controller, or for v2 when controller is "".
std::string OwnCgroupPath(const std::string& controller) {
  std::istringstream in(ReadSmallFile("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find(':');
    size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controller.empty()) {
      if (line.compare(0, a, "0") == 0 && ctrls.empty()) return path;
      continue;
    }
    std::istringstream cs(ctrls);
    std::string c;
    while (std::getline(cs, c, ',')) {
      if (c == controller) return path;
    }
  }
  return "/";
}

std::string JoinPath(const std::string& base, const std::string& rel) {
  if (rel.empty() || rel == "/") return base;
  return base + rel;
}

// A parent folder is usable when a child cgroup can be made there and has `probe_file`.
bool CanCreateChild(const std::string& parent, const std::string& probe_file) {
  std::string dir =
      parent + "/bitroll-probe-" + std::to_string(getpid()) + "-" + std::to_string(gettid());
  if (mkdir(dir.c_str(), 0755) != 0) return false;
  bool ok = Exists(dir + "/" + probe_file);
  rmdir(dir.c_str());
  return ok;
}

uint64_t ParseKey(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

uint64_t ReadU64(const std::string& path) {
  std::string s = ReadSmallFile(path);
  return s.empty() ? 0 : std::strtoull(s.c_str(), nullptr, 10);
}

std::vector<int> ReadPids(const std::string& procs_file) {
  std::vector<int> pids;
  std::istringstream in(ReadSmallFile(procs_file));
  int pid;
  while (in >> pid) pids.push_back(pid);
  return pids;
}

}  // namespace

std::string ReadSmallFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) break;
  }
  close(fd);
  return out;
}

const char* CgroupSupport::Name() const {
  switch (version) {
    case 2:
      return "cgroup-v2";
    case 1:
      return "cgroup-v1";
    default:
      return "rlimits";
  }
}

CgroupSupport CgroupSupport::Detect() {
  CgroupSupport s;
  std::string root = kRoot;
  if (Exists(root + "/cgroup.controllers")) {  // pure v2 mount
    std::string own = JoinPath(root, OwnCgroupPath(""));
    if (CanCreateChild(own, "memory.max") && CanCreateChild(own, "pids.max")) {
      s.version = 2;
      s.memory_parent = own;
      s.pids_parent = own;
      return s;
    }
  }
  std::string mem = JoinPath(root + "/memory", OwnCgroupPath("memory"));
  std::string pids = JoinPath(root + "/pids", OwnCgroupPath("pids"));
  bool mem_ok = Exists(root + "/memory/memory.limit_in_bytes") &&
                CanCreateChild(mem, "memory.limit_in_bytes");
  bool pids_ok = Exists(root + "/pids") && CanCreateChild(pids, "pids.max");
  if (mem_ok || pids_ok) {
    s.version = 1;
    if (mem_ok) s.memory_parent = mem;
    if (pids_ok) s.pids_parent = pids;
  }
  return s;
}

Result<std::unique_ptr<RunCgroup>> RunCgroup::Create(const CgroupSupport& support,
                                                     const std::string& name, uint64_t memory_bytes,
                                                     uint32_t max_pids) {
  std::unique_ptr<RunCgroup> cg(new RunCgroup());
  cg->version_ = support.version;
  const std::string leaf = "/bitroll-" + name;
  auto make = [](const std::string& dir) -> Status {
    if (mkdir(dir.c_str(), 0755) != 0) {
      return Status::IoError("mkdir " + dir + ": " + std::strerror(errno));
    }
    return Status::Ok();
  };
  if (support.version == 2) {
    cg->memory_dir_ = support.memory_parent + leaf;
    cg->pids_dir_ = cg->memory_dir_;
    BR_RETURN_IF_ERROR(make(cg->memory_dir_));
    WriteFile(cg->memory_dir_ + "/memory.swap.max", "0");
  } else {
    if (!support.memory_parent.empty()) {
      cg->memory_dir_ = support.memory_parent + leaf;
      BR_RETURN_IF_ERROR(make(cg->memory_dir_));
    }
    if (!support.pids_parent.empty()) {
      cg->pids_dir_ = support.pids_parent + leaf;
      BR_RETURN_IF_ERROR(make(cg->pids_dir_));
    }
  }
  BR_RETURN_IF_ERROR(cg->SetLimits(memory_bytes, max_pids));
  return cg;
}

Status RunCgroup::SetLimits(uint64_t memory_bytes, uint32_t max_pids) {
  if (version_ == 2) {
    if (!WriteFile(memory_dir_ + "/memory.max", std::to_string(memory_bytes)) ||
        !WriteFile(pids_dir_ + "/pids.max", std::to_string(max_pids))) {
      return Status::IoError("cannot set limits in " + memory_dir_);
    }
    return Status::Ok();
  }
  if (!memory_dir_.empty()) {
    // memsw must stay >= the memory limit: raise it first when growing, lower it after when
    // shrinking (one of the two memsw writes fails harmlessly; both where swap accounting is off).
    const std::string v = std::to_string(memory_bytes);
    WriteFile(memory_dir_ + "/memory.memsw.limit_in_bytes", v);
    if (!WriteFile(memory_dir_ + "/memory.limit_in_bytes", v)) {
      return Status::IoError("cannot set memory.limit_in_bytes in " + memory_dir_ + ": " +
                             std::strerror(errno));
    }
    WriteFile(memory_dir_ + "/memory.memsw.limit_in_bytes", v);
  }
  if (!pids_dir_.empty() && !WriteFile(pids_dir_ + "/pids.max", std::to_string(max_pids))) {
    return Status::IoError("cannot set pids.max in " + pids_dir_);
  }
  return Status::Ok();
}

RunCgroup::~RunCgroup() {
  KillAll();
  // rmdir can fail briefly while the kernel finishes tearing down killed tasks.
  for (const std::string& dir : {pids_dir_, memory_dir_}) {
    if (dir.empty()) continue;
    for (int i = 0; i < 200 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (version_ == 2) break;  // one folder for both
  }
}

std::vector<std::string> RunCgroup::ProcsFiles() const {
  std::vector<std::string> files;
  if (!memory_dir_.empty()) files.push_back(memory_dir_ + "/cgroup.procs");
  if (!pids_dir_.empty() && pids_dir_ != memory_dir_) files.push_back(pids_dir_ + "/cgroup.procs");
  return files;
}

int RunCgroup::KillAll() {
  std::string dir = !pids_dir_.empty() ? pids_dir_ : memory_dir_;
  if (dir.empty()) return 0;
  if (version_ == 2) WriteFile(dir + "/cgroup.kill", "1");
  int seen = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::vector<int> pids = ReadPids(dir + "/cgroup.procs");
    if (pids.empty()) break;
    seen += static_cast<int>(pids.size());
    for (int pid : pids) kill(pid, SIGKILL);
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return seen;
}

bool RunCgroup::MemoryLimitHit() const {
  if (memory_dir_.empty()) return false;
  if (version_ == 2) {
    std::string ev = ReadSmallFile(memory_dir_ + "/memory.events");
    return ParseKey(ev, "oom_kill") > 0 || ParseKey(ev, "oom") > 0;
  }
  return ReadU64(memory_dir_ + "/memory.failcnt") > 0 ||
         ParseKey(ReadSmallFile(memory_dir_ + "/memory.oom_control"), "oom_kill") > 0;
}

bool RunCgroup::PidsLimitHit() const {
  if (pids_dir_.empty()) return false;
  return ParseKey(ReadSmallFile(pids_dir_ + "/pids.events"), "max") > 0;
}

uint64_t RunCgroup::PeakMemoryBytes() const {
  if (memory_dir_.empty()) return 0;
  if (version_ == 2) return ReadU64(memory_dir_ + "/memory.peak");
  return ReadU64(memory_dir_ + "/memory.max_usage_in_bytes");
}

}  // namespace bitroll::sandbox
