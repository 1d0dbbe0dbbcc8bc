// Internal to sandbox/: a run's private workdir on the host: create it for a uid, place the
// request's files, collect output files without following links, remove it.
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

class Workdir {
 public:
  // Creates <root>/bitroll-sb-<pid>-<seq> (mode 0700) owned by uid:gid and writes `files`
  // into it (owned by uid:gid too).
  static Result<std::unique_ptr<Workdir>> Create(const std::string& root, uint32_t uid,
                                                 uint32_t gid,
                                                 const std::map<std::string, std::string>& files);
  // Writes `files` into the folder, owned by uid:gid (for a workdir made before its request).
  Status AddFiles(const std::map<std::string, std::string>& files, uint32_t uid, uint32_t gid);
  // Removes the folder and everything in it (links are removed, never followed).
  ~Workdir();
  const std::string& path() const { return path_; }
  // Reads each named regular file (O_NOFOLLOW; symlinks, fifos and folders are skipped), keeping
  // at most max_bytes of each and marking bigger ones truncated.
  std::map<std::string, OutputFile> Collect(const std::vector<std::string>& names,
                                            uint64_t max_bytes) const;

 private:
  Workdir() = default;
  std::string path_;
};

}  // namespace bitroll::sandbox
