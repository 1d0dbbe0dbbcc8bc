// engine/loaders/mapped_file.h: a read-only memory mapping of a whole file, shared by the loaders.
//
// Ownership: MapFile returns a shared_ptr; the mapping lives until the last copy is dropped, so a
// ModelWeights can keep it (ModelWeights::storage) while Tensors point into it.
// Thread-safety: the mapping is immutable; any number of threads may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "schema/status.h"

namespace bitroll::engine {

struct MappedFile {
  const uint8_t* data = nullptr;  // nullptr for an empty file
  size_t size = 0;
  std::string path;

  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
};

// Maps `path` read-only (MAP_PRIVATE). Errors: kNotFound (no such file), kInvalidArgument (a
// directory), kIoError (open/stat/mmap failed).
Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& path);

// The last component of a path ("a/b/c.gguf" -> "c.gguf").
std::string PathBaseName(const std::string& path);

}  // namespace bitroll::engine
