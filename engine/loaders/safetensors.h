// engine/loaders/safetensors.h: the safetensors container (Hugging Face's weight files).
//
// File layout: uint64 little-endian N, then N bytes of UTF-8 JSON, then the data section.
// The JSON object maps each tensor name to {"dtype": "F32", "shape": [d0, d1, ...],
// "data_offsets": [begin, end]} (byte offsets relative to the data section, end exclusive), plus
// an optional "__metadata__" object of string -> string.
//
// ParseSafetensors checks every field before use, so it is safe on arbitrary bytes (it is
// fuzzed): a header length past the end, non-JSON, wrong field types, an unknown dtype, a byte
// range that disagrees with shape x dtype size, ranges past the end of the file or overlapping
// each other all give typed errors.
//
// Thread-safety: a SafetensorsHeader is an immutable value after parsing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "schema/status.h"

namespace bitroll::engine {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;       // "F32", "BF16", ... as written
  int64_t elem_bytes = 0;  // bytes per element of dtype
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to SafetensorsHeader::data_offset
  uint64_t end = 0;    // exclusive; end - begin == numel * elem_bytes
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;                     // 8 + N: where the data section starts in the file
  std::vector<SafetensorsTensor> tensors;       // sorted by name
  std::map<std::string, size_t> index;          // name -> index into tensors
  std::map<std::string, std::string> metadata;  // "__metadata__"

  const SafetensorsTensor* Find(const std::string& name) const;  // nullptr when absent
};

struct SafetensorsParseOptions {
  uint64_t max_header_bytes = 100ull << 20;  // the reference implementation's limit
  // When true, every tensor must lie inside the buffer (pass the whole file). When false (the
  // header alone), ranges are checked only against each other.
  bool check_data_bounds = true;
};

// Parses the header of the file in data[0, size). Errors: kCorruption for every malformed
// header (the message names the tensor and field), kUnsupported for a header over
// max_header_bytes.
Result<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size,
                                           const SafetensorsParseOptions& options = {});

// Bytes per element of a safetensors dtype name, or 0 when unknown.
int64_t SafetensorsDTypeBytes(const std::string& dtype);

}  // namespace bitroll::engine
