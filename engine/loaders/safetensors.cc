// engine/loaders/safetensors.cc: safetensors header parsing (see the header).
#include "engine/loaders/safetensors.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>

namespace bitroll::engine {
namespace {

using nlohmann::json;

Status Bad(const std::string& what) {
  return Status::Corruption("safetensors: " + what);
}

Status ParseTensor(const std::string& name, const json& j, SafetensorsTensor* t) {
  if (!j.is_object()) return Bad("tensor " + name + " is not an object");
  t->name = name;
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) return Bad("tensor " + name + " has no string dtype");
  t->dtype = dt->get<std::string>();
  t->elem_bytes = SafetensorsDTypeBytes(t->dtype);
  if (t->elem_bytes == 0) return Bad("tensor " + name + " has unknown dtype \"" + t->dtype + "\"");
  auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array() || sh->size() > 8) {
    return Bad("tensor " + name + " has no shape array of at most 8 dimensions");
  }
  uint64_t numel = 1;
  for (const json& d : *sh) {
    if (!d.is_number_unsigned()) {
      return Bad("tensor " + name + " has a shape entry that is not a non-negative integer");
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > (uint64_t(1) << 40) || __builtin_mul_overflow(numel, v, &numel) ||
        numel > (uint64_t(1) << 48)) {
      return Bad("tensor " + name + " has an absurd shape");
    }
    t->shape.push_back(int64_t(v));
  }
  auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return Bad("tensor " + name + " has no data_offsets [begin, end] of non-negative integers");
  }
  t->begin = (*off)[0].get<uint64_t>();
  t->end = (*off)[1].get<uint64_t>();
  if (t->end < t->begin) {
    return Bad("tensor " + name + " has data_offsets [" + std::to_string(t->begin) + ", " +
               std::to_string(t->end) + "] with end before begin");
  }
  const uint64_t want = numel * uint64_t(t->elem_bytes);  // < 2^52: no overflow
  if (t->end - t->begin != want) {
    return Bad("tensor " + name + " has " + std::to_string(t->end - t->begin) +
               " bytes, its shape and dtype " + t->dtype + " need " + std::to_string(want));
  }
  return Status::Ok();
}

}  // namespace

int64_t SafetensorsDTypeBytes(const std::string& d) {
  static const std::map<std::string, int64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(d);
  return it == kSizes.end() ? 0 : it->second;
}

const SafetensorsTensor* SafetensorsHeader::Find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

Result<SafetensorsHeader> ParseSafetensors(const uint8_t* data, size_t size,
                                           const SafetensorsParseOptions& opt) {
  if (size < 8) {
    return Bad("file of " + std::to_string(size) + " bytes is shorter than the 8-byte length");
  }
  uint64_t n;
  std::memcpy(&n, data, 8);
  if (n > opt.max_header_bytes) {
    return Status::Unsupported("safetensors: header of " + std::to_string(n) +
                               " bytes exceeds the limit of " +
                               std::to_string(opt.max_header_bytes));
  }
  if (n > size - 8) {
    return Bad("header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(size) + " bytes)");
  }
  if (n < 2 || data[8] != '{') return Bad("header does not start with a JSON object");
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  try {
    const json j = json::parse(data + 8, data + 8 + n, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Bad("header is not a valid JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) return Bad("__metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) return Bad("__metadata__ value " + m.key() + " is not a string");
          h.metadata[m.key()] = m->get<std::string>();
        }
        continue;
      }
      SafetensorsTensor t;
      BR_RETURN_IF_ERROR(ParseTensor(it.key(), *it, &t));
      h.tensors.push_back(std::move(t));
    }
  } catch (const std::exception& e) {
    return Bad(std::string("header could not be parsed: ") + e.what());
  }
  // nlohmann's object iterates in key order, so tensors are sorted by name and names are unique.
  for (size_t i = 0; i < h.tensors.size(); ++i) h.index[h.tensors[i].name] = i;
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : h.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
            });
  const uint64_t data_bytes = size - h.data_offset;
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const SafetensorsTensor& t = *by_offset[i];
    if (opt.check_data_bounds && t.end > data_bytes) {
      return Bad("tensor " + t.name + " [" + std::to_string(t.begin) + ", " +
                 std::to_string(t.end) + ") runs past the end of the data section (" +
                 std::to_string(data_bytes) + " bytes)");
    }
    if (i + 1 < by_offset.size() && t.end > by_offset[i + 1]->begin &&
        by_offset[i + 1]->end > by_offset[i + 1]->begin && t.end > t.begin) {
      return Bad("tensors " + t.name + " and " + by_offset[i + 1]->name + " overlap");
    }
  }
  return h;
}

}  // namespace bitroll::engine
