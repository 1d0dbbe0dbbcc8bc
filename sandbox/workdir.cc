#include "sandbox/workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace bitroll::sandbox {

bool ValidFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status ValidateFileNames(const Request& request) {
  for (const auto& [name, data] : request.files) {
    if (!ValidFileName(name)) return Status::InvalidArgument("bad input file name '" + name + "'");
  }
  for (const std::string& name : request.output_files) {
    if (!ValidFileName(name)) return Status::InvalidArgument("bad output file name '" + name + "'");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Workdir>> Workdir::Create(const std::string& root, uint32_t uid,
                                                 uint32_t gid,
                                                 const std::map<std::string, std::string>& files) {
  static std::atomic<uint64_t> seq{0};
  std::unique_ptr<Workdir> w(new Workdir());
  w->path_ = root + "/bitroll-sb-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
  if (mkdir(w->path_.c_str(), 0700) != 0) {
    std::string err = std::strerror(errno);
    w->path_.clear();
    return Status::IoError("mkdir workdir under " + root + ": " + err);
  }
  if (chown(w->path_.c_str(), uid, gid) != 0) {
    return Status::IoError("chown " + w->path_ + ": " + std::strerror(errno));
  }
  BR_RETURN_IF_ERROR(w->AddFiles(files, uid, gid));
  return w;
}

Status Workdir::AddFiles(const std::map<std::string, std::string>& files, uint32_t uid,
                         uint32_t gid) {
  for (const auto& [name, data] : files) {
    std::string p = path_ + "/" + name;
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IoError("create " + p + ": " + std::strerror(errno));
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int e = errno;
        close(fd);
        return Status::IoError("write " + p + ": " + std::strerror(e));
      }
      off += static_cast<size_t>(n);
    }
    if (fchown(fd, uid, gid) != 0) {
      int e = errno;
      close(fd);
      return Status::IoError("chown " + p + ": " + std::strerror(e));
    }
    close(fd);
  }
  return Status::Ok();
}

Workdir::~Workdir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::map<std::string, OutputFile> Workdir::Collect(const std::vector<std::string>& names,
                                                   uint64_t max_bytes) const {
  std::map<std::string, OutputFile> out;
  int dir = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) return out;
  for (const std::string& name : names) {
    if (!ValidFileName(name)) continue;
    int fd = openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      continue;
    }
    OutputFile f;
    char buf[65536];
    for (;;) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      uint64_t room = max_bytes - f.data.size();
      if (static_cast<uint64_t>(n) > room) {
        f.data.append(buf, room);
        f.truncated = true;
        break;
      }
      f.data.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    out[name] = std::move(f);
  }
  close(dir);
  return out;
}

}  // namespace bitroll::sandbox
