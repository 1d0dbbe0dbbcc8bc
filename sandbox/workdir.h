// Internal to sandbox/: a run's private workdir on the host: create it for a uid (a size-capped
// tmpfs, or a plain folder), place the request's files, collect output files without following
// links, remove it (whatever its depth).
//
// Thread-safety: a Workdir is owned by one run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sandbox/sandbox.h"
#include "schema/status.h"

namespace bitroll::sandbox {

// A file name the sandbox accepts: one path component of [A-Za-z0-9._-], not "." or "..",
// 1..255 bytes.
bool ValidFileName(const std::string& name);
// Checks every name in files and output_files.
Status ValidateFileNames(const Request& request);

// Removes `path` and everything beneath it, never following links, holding at most three
// descriptors whatever the depth (it walks down with openat and back up with "..", checking
// each parent's identity). REQUIRES: nothing else changes the tree meanwhile (every process of
// the run is dead). Errors: kIoError naming what could not be removed.
Status RemoveTree(const std::string& path);

class Workdir {
 public:
  // Creates <root>/bitroll-sb-<pid>-<seq> (mode 0700) owned by uid:gid and writes `files`
  // into it (owned by uid:gid too). disk_bytes > 0: the folder is a tmpfs of that size (and
  // one inode per 4 KiB, at least 1024) mounted in the caller's mount namespace (needs
  // CAP_SYS_ADMIN); 0: a plain folder. Errors: kIoError (mkdir, mount, writing the files).
  static Result<std::unique_ptr<Workdir>> Create(const std::string& root, uint32_t uid,
                                                 uint32_t gid,
                                                 const std::map<std::string, std::string>& files,
                                                 uint64_t disk_bytes = 0);
  // Writes `files` into the folder, owned by uid:gid (for a workdir made before its request).
  Status AddFiles(const std::map<std::string, std::string>& files, uint32_t uid, uint32_t gid);
  // Unmounts the tmpfs (lazily) or removes the folder and everything in it with RemoveTree
  // (links are removed, never followed).
  ~Workdir();
  const std::string& path() const { return path_; }
  // True when the workdir is a tmpfs with no free block or inode left (the run filled it).
  bool Full() const;
  // Reads each named regular file (O_NOFOLLOW; symlinks, fifos and folders are skipped), keeping
  // at most max_bytes of each and marking bigger ones truncated.
  std::map<std::string, OutputFile> Collect(const std::vector<std::string>& names,
                                            uint64_t max_bytes) const;

 private:
  Workdir() = default;
  std::string path_;
  bool mounted_ = false;
};

}  // namespace bitroll::sandbox
