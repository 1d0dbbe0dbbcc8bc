// engine/loaders/mapped_file.cc: read-only whole-file mappings.
#include "engine/loaders/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace bitroll::engine {

MappedFile::~MappedFile() {
  if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
}

Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("no file " + path);
    return Status::IoError("cannot open " + path + ": " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IoError("cannot stat " + path + ": " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + " is a directory, not a file");
  }
  auto m = std::make_shared<MappedFile>();
  m->path = path;
  m->size = size_t(st.st_size);
  if (m->size > 0) {
    void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::IoError("cannot mmap " + path + ": " + std::strerror(err));
    }
    m->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(m));
}

std::string PathBaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace bitroll::engine
