#include "sandbox/workdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

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

namespace {

std::string Errno(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

}  // namespace

Status RemoveTree(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    if ((errno == ENOTDIR || errno == ELOOP) && unlink(path.c_str()) == 0) return Status::Ok();
    return Status::IoError(Errno("open " + path, errno));
  }
  // The ancestors of the current folder: identity (to check the way back up) and the name of
  // the child we went down into. Memory grows with the depth; descriptors do not.
  struct Up {
    dev_t dev;
    ino_t ino;
    std::string child;
  };
  std::vector<Up> up;
  for (;;) {
    // Unlink every non-folder here; stop at the first subfolder.
    std::string sub;
    int dfd = dup(fd);
    DIR* d = dfd < 0 ? nullptr : fdopendir(dfd);
    if (d == nullptr) {
      int e = errno;
      if (dfd >= 0) close(dfd);
      close(fd);
      return Status::IoError(Errno("read folder under " + path, e));
    }
    rewinddir(d);
    while (const dirent* e = readdir(d)) {
      const char* n = e->d_name;
      if (std::strcmp(n, ".") == 0 || std::strcmp(n, "..") == 0) continue;
      if (e->d_type == DT_DIR) {
        sub = n;
        break;
      }
      if (unlinkat(fd, n, 0) != 0 && errno == EISDIR) {  // d_type unknown: a folder
        sub = n;
        break;
      }
    }
    closedir(d);
    if (!sub.empty()) {
      struct stat st;
      int child = openat(fd, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (child >= 0) close(child);
        close(fd);
        return Status::IoError(Errno("open " + sub + " under " + path, e));
      }
      up.push_back({st.st_dev, st.st_ino, std::move(sub)});
      close(fd);
      fd = child;
      continue;
    }
    // This folder is empty: remove it from its parent.
    if (up.empty()) {
      close(fd);
      if (rmdir(path.c_str()) != 0) return Status::IoError(Errno("rmdir " + path, errno));
      return Status::Ok();
    }
    int parent = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(fd);
    struct stat st;
    if (parent < 0 || fstat(parent, &st) != 0 || st.st_dev != up.back().dev ||
        st.st_ino != up.back().ino) {
      if (parent >= 0) close(parent);
      return Status::IoError("the tree under " + path + " moved while it was removed");
    }
    if (unlinkat(parent, up.back().child.c_str(), AT_REMOVEDIR) != 0) {
      int e = errno;
      close(parent);
      return Status::IoError(Errno("rmdir " + up.back().child + " under " + path, e));
    }
    up.pop_back();
    fd = parent;
  }
}

Result<std::unique_ptr<Workdir>> Workdir::Create(const std::string& root, uint32_t uid,
                                                 uint32_t gid,
                                                 const std::map<std::string, std::string>& files,
                                                 uint64_t disk_bytes) {
  static std::atomic<uint64_t> seq{0};
  std::unique_ptr<Workdir> w(new Workdir());
  w->path_ = root + "/bitroll-sb-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
  if (mkdir(w->path_.c_str(), 0700) != 0) {
    std::string err = std::strerror(errno);
    w->path_.clear();
    return Status::IoError("mkdir workdir under " + root + ": " + err);
  }
  if (disk_bytes > 0) {
    const uint64_t inodes = std::max<uint64_t>(1024, disk_bytes / 4096);
    const std::string opts =
        "size=" + std::to_string(disk_bytes) + ",nr_inodes=" + std::to_string(inodes) +
        ",mode=0700,uid=" + std::to_string(uid) + ",gid=" + std::to_string(gid);
    if (mount("bitroll-work", w->path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      return Status::IoError(Errno("mount a tmpfs workdir on " + w->path_ +
                                       " (SandboxOptions::work_disk_bytes = 0 turns the total "
                                       "disk cap off)",
                                   errno));
    }
    w->mounted_ = true;
  } else if (chown(w->path_.c_str(), uid, gid) != 0) {
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
  // A lazy unmount frees the whole tree at once; the folder under it is then empty.
  if (mounted_ && umount2(path_.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) {
    if (rmdir(path_.c_str()) == 0) return;
  }
  Status s = RemoveTree(path_);  // best effort: a destructor has no one to report to
  (void)s;
}

bool Workdir::Full() const {
  if (!mounted_) return false;
  struct statvfs st;
  if (statvfs(path_.c_str(), &st) != 0) return false;
  return st.f_bavail == 0 || st.f_favail == 0;
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
