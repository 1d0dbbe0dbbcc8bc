// engine/loaders/gguf.cc: GGUF parsing, the Llama/Qwen2 mapping and the embedded tokenizer.
#include "engine/loaders/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "engine/loaders/mapped_file.h"
#include "engine/tokenizers/llama2c_tokenizer.h"

namespace bitroll::engine {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian

// ggml element types: block size (elements) and bytes per block. Zero block = unknown.
struct GgmlTypeInfo {
  const char* name;
  uint32_t block;
  uint32_t bytes;
};
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {"F32", 1, 4},        {"F16", 1, 2},       {"Q4_0", 32, 18},     {"Q4_1", 32, 20},
    {"Q4_2", 0, 0},       {"Q4_3", 0, 0},      {"Q5_0", 32, 22},     {"Q5_1", 32, 24},
    {"Q8_0", 32, 34},     {"Q8_1", 32, 36},    {"Q2_K", 256, 84},    {"Q3_K", 256, 110},
    {"Q4_K", 256, 144},   {"Q5_K", 256, 176},  {"Q6_K", 256, 210},   {"Q8_K", 256, 292},
    {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},   {"IQ4_XS", 256, 136},
    {"I8", 1, 1},         {"I16", 1, 2},       {"I32", 1, 4},        {"I64", 1, 8},
    {"F64", 1, 8},        {"IQ1_M", 256, 56},  {"BF16", 1, 2},       {"Q4_0_4_4", 0, 0},
    {"Q4_0_4_8", 0, 0},   {"Q4_0_8_8", 0, 0},  {"TQ1_0", 256, 54},   {"TQ2_0", 256, 66},
};
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBF16 = 30;

const GgmlTypeInfo* TypeInfo(uint32_t t) {
  if (t >= sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0]) || kGgmlTypes[t].block == 0) return nullptr;
  return &kGgmlTypes[t];
}

// Bounds-checked little-endian reader over the header.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (left() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, uint64_t max_bytes, const char* what) {
    uint64_t n = 0;
    BR_RETURN_IF_ERROR(Read(&n, what));
    if (n > max_bytes) {
      return Status::Corruption(std::string("gguf: ") + what + " of " + std::to_string(n) +
                                " bytes at offset " + std::to_string(pos_ - 8) +
                                " exceeds the limit of " + std::to_string(max_bytes));
    }
    if (left() < n) return Truncated(what, n);
    out->assign(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += size_t(n);
    return Status::Ok();
  }
  Status Truncated(const char* what, uint64_t need) const {
    return Status::Corruption(std::string("gguf: truncated reading ") + what + " at offset " +
                              std::to_string(pos_) + ": need " + std::to_string(need) + " bytes, " +
                              std::to_string(left()) + " left");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one value of type t (used to bound array counts before allocating).
uint64_t MinEncodedSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

bool KnownType(uint32_t t) {
  return t <= uint32_t(GgufType::kFloat64);
}

Status ReadValue(Reader& r, GgufType type, int depth, const GgufParseOptions& opt, GgufValue* v) {
  v->type = type;
  switch (type) {
    case GgufType::kUint8: {
      uint8_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "uint8 value"));
      v->u64 = x;
      return Status::Ok();
    }
    case GgufType::kInt8: {
      int8_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "int8 value"));
      v->i64 = x;
      return Status::Ok();
    }
    case GgufType::kUint16: {
      uint16_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "uint16 value"));
      v->u64 = x;
      return Status::Ok();
    }
    case GgufType::kInt16: {
      int16_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "int16 value"));
      v->i64 = x;
      return Status::Ok();
    }
    case GgufType::kUint32: {
      uint32_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "uint32 value"));
      v->u64 = x;
      return Status::Ok();
    }
    case GgufType::kInt32: {
      int32_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "int32 value"));
      v->i64 = x;
      return Status::Ok();
    }
    case GgufType::kFloat32: {
      float x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "float32 value"));
      v->f64 = x;
      return Status::Ok();
    }
    case GgufType::kBool: {
      uint8_t x = 0;
      BR_RETURN_IF_ERROR(r.Read(&x, "bool value"));
      if (x > 1) {
        return Status::Corruption("gguf: bool value " + std::to_string(x) + " at offset " +
                                  std::to_string(r.pos() - 1) + " is neither 0 nor 1");
      }
      v->u64 = x;
      return Status::Ok();
    }
    case GgufType::kString:
      return r.ReadString(&v->str, opt.max_string_bytes, "string value");
    case GgufType::kUint64:
      return r.Read(&v->u64, "uint64 value");
    case GgufType::kInt64:
      return r.Read(&v->i64, "int64 value");
    case GgufType::kFloat64:
      return r.Read(&v->f64, "float64 value");
    case GgufType::kArray: {
      if (depth >= opt.max_array_depth) {
        return Status::Corruption("gguf: arrays nested deeper than " +
                                  std::to_string(opt.max_array_depth) + " at offset " +
                                  std::to_string(r.pos()));
      }
      uint32_t et = 0;
      uint64_t n;
      BR_RETURN_IF_ERROR(r.Read(&et, "array element type"));
      if (!KnownType(et)) {
        return Status::Corruption("gguf: unknown array element type " + std::to_string(et) +
                                  " at offset " + std::to_string(r.pos() - 4));
      }
      BR_RETURN_IF_ERROR(r.Read(&n, "array length"));
      v->elem_type = GgufType(et);
      if (n > opt.max_array_elements || n > r.left() / MinEncodedSize(v->elem_type)) {
        return Status::Corruption("gguf: array of " + std::to_string(n) + " " +
                                  GgufTypeName(v->elem_type) + " at offset " +
                                  std::to_string(r.pos() - 8) + " cannot fit in the " +
                                  std::to_string(r.left()) + " bytes left (limit " +
                                  std::to_string(opt.max_array_elements) + " elements)");
      }
      v->array.resize(size_t(n));
      for (GgufValue& e : v->array) {
        BR_RETURN_IF_ERROR(ReadValue(r, v->elem_type, depth + 1, opt, &e));
      }
      return Status::Ok();
    }
  }
  return Status::Corruption("gguf: unknown value type " + std::to_string(uint32_t(type)));
}

}  // namespace

const char* GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

const char* GgmlTypeName(uint32_t t) {
  if (t >= sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0])) return "unknown";
  return kGgmlTypes[t].name;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const {
  return type == GgufType::kFloat32 || type == GgufType::kFloat64;
}

namespace {
bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 ||
         t == GgufType::kInt64;
}
}  // namespace

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_index.find(key);
  return it == metadata_index.end() ? nullptr : &metadata[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index.find(name);
  return it == tensor_index.end() ? nullptr : &tensors[it->second];
}

Result<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound("gguf: no metadata key " + key);
  if (!v->is_integer()) {
    return Status::Corruption("gguf: " + key + " is a " + GgufTypeName(v->type) +
                              ", expected an integer");
  }
  if (IsSigned(v->type)) return v->i64;
  if (v->u64 > uint64_t(std::numeric_limits<int64_t>::max())) {
    return Status::Corruption("gguf: " + key + " = " + std::to_string(v->u64) + " is too large");
  }
  return int64_t(v->u64);
}

Result<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound("gguf: no metadata key " + key);
  if (v->is_float()) return v->f64;
  if (v->is_integer()) return IsSigned(v->type) ? double(v->i64) : double(v->u64);
  return Status::Corruption("gguf: " + key + " is a " + GgufTypeName(v->type) +
                            ", expected a number");
}

Result<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound("gguf: no metadata key " + key);
  if (v->type != GgufType::kString) {
    return Status::Corruption("gguf: " + key + " is a " + GgufTypeName(v->type) +
                              ", expected a string");
  }
  return v->str;
}

Result<GgufFile> ParseGguf(const uint8_t* data, size_t size, const GgufParseOptions& opt) {
  Reader r(data, size);
  uint32_t magic = 0;
  BR_RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    return Status::Corruption(std::string("gguf: bad magic ") + hex + ", expected \"GGUF\"");
  }
  GgufFile f;
  BR_RETURN_IF_ERROR(r.Read(&f.version, "version"));
  if (f.version == 1) {
    return Status::Unsupported("gguf: version 1 (32-bit counts) is not supported; use v2 or v3");
  }
  if ((f.version & 0xFFFF) == 0 && f.version != 0) {
    return Status::Unsupported("gguf: big-endian file (version field " + std::to_string(f.version) +
                               ") is not supported");
  }
  if (f.version < 2 || f.version > 3) {
    return Status::Unsupported("gguf: version " + std::to_string(f.version) +
                               " is not supported (2 and 3 are)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  BR_RETURN_IF_ERROR(r.Read(&n_tensors, "tensor count"));
  BR_RETURN_IF_ERROR(r.Read(&n_kv, "metadata count"));
  // Each metadata pair needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8+4+4+8.
  if (n_kv > opt.max_metadata || n_kv > r.left() / 13) {
    return Status::Corruption("gguf: metadata count " + std::to_string(n_kv) +
                              " is absurd for a header of " + std::to_string(size) + " bytes");
  }
  if (n_tensors > opt.max_tensors || n_tensors > r.left() / 24) {
    return Status::Corruption("gguf: tensor count " + std::to_string(n_tensors) +
                              " is absurd for a header of " + std::to_string(size) + " bytes");
  }
  f.metadata.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    BR_RETURN_IF_ERROR(r.ReadString(&key, opt.max_string_bytes, "metadata key"));
    uint32_t type = 0;
    BR_RETURN_IF_ERROR(r.Read(&type, "metadata value type"));
    if (!KnownType(type)) {
      return Status::Corruption("gguf: metadata " + key + " has unknown value type " +
                                std::to_string(type));
    }
    GgufValue v;
    Status s = ReadValue(r, GgufType(type), 0, opt, &v);
    if (!s.ok()) return s.WithContext("metadata " + key);
    if (!f.metadata_index.emplace(key, f.metadata.size()).second) {
      return Status::Corruption("gguf: duplicate metadata key " + key);
    }
    f.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f.Find("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->u64 == 0 || (a->u64 & (a->u64 - 1)) != 0) {
      return Status::Corruption("gguf: general.alignment must be a uint32 power of two, got a " +
                                std::string(GgufTypeName(a->type)) + " " + std::to_string(a->u64));
    }
    f.alignment = a->u64;
  }
  f.tensors.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    BR_RETURN_IF_ERROR(r.ReadString(&t.name, opt.max_string_bytes, "tensor name"));
    uint32_t n_dims = 0;
    BR_RETURN_IF_ERROR(r.Read(&n_dims, "tensor dimension count"));
    if (n_dims == 0 || n_dims > 4) {
      return Status::Corruption("gguf: tensor " + t.name + " has " + std::to_string(n_dims) +
                                " dimensions (1..4 allowed)");
    }
    t.ne.resize(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      BR_RETURN_IF_ERROR(r.Read(&t.ne[d], "tensor dimension"));
      if (t.ne[d] == 0 || t.ne[d] > (uint64_t(1) << 40) ||
          __builtin_mul_overflow(numel, t.ne[d], &numel) || numel > (uint64_t(1) << 48)) {
        return Status::Corruption("gguf: tensor " + t.name + " dimension " + std::to_string(d) +
                                  " = " + std::to_string(t.ne[d]) + " is zero or too large");
      }
    }
    BR_RETURN_IF_ERROR(r.Read(&t.ggml_type, "tensor type"));
    const GgmlTypeInfo* ti = TypeInfo(t.ggml_type);
    if (ti == nullptr) {
      return Status::Corruption("gguf: tensor " + t.name + " has unknown ggml type " +
                                std::to_string(t.ggml_type));
    }
    if (t.ne[0] % ti->block != 0) {
      return Status::Corruption("gguf: tensor " + t.name + " of type " + ti->name +
                                " has a row of " + std::to_string(t.ne[0]) +
                                " elements, not a multiple of its block " +
                                std::to_string(ti->block));
    }
    t.size_bytes = numel / ti->block * ti->bytes;
    BR_RETURN_IF_ERROR(r.Read(&t.offset, "tensor offset"));
    if (t.offset % f.alignment != 0) {
      return Status::Corruption("gguf: tensor " + t.name + " offset " + std::to_string(t.offset) +
                                " is not a multiple of the alignment " +
                                std::to_string(f.alignment));
    }
    if (t.offset > (uint64_t(1) << 56)) {
      return Status::Corruption("gguf: tensor " + t.name + " offset " + std::to_string(t.offset) +
                                " is absurd");
    }
    if (!f.tensor_index.emplace(t.name, f.tensors.size()).second) {
      return Status::Corruption("gguf: duplicate tensor name " + t.name);
    }
    f.tensors.push_back(std::move(t));
  }
  const uint64_t header_end = r.pos();
  f.data_offset = (header_end + f.alignment - 1) / f.alignment * f.alignment;
  // Tensor ranges: inside the data section, and disjoint.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(f.tensors.size());
  for (const GgufTensorInfo& t : f.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  const uint64_t data_bytes = size > f.data_offset ? size - f.data_offset : 0;
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const GgufTensorInfo& t = *by_offset[i];
    const uint64_t end = t.offset + t.size_bytes;  // both < 2^57: no overflow
    if (opt.check_data_bounds && (f.data_offset > size || end > data_bytes)) {
      return Status::Corruption("gguf: tensor " + t.name + " [" + std::to_string(t.offset) + ", " +
                                std::to_string(end) + ") runs past the end of the data section (" +
                                std::to_string(data_bytes) + " bytes)");
    }
    if (i + 1 < by_offset.size() && end > by_offset[i + 1]->offset) {
      return Status::Corruption("gguf: tensors " + t.name + " and " + by_offset[i + 1]->name +
                                " overlap");
    }
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// The Llama / Qwen2 mapping.

namespace {

struct Mapper {
  const GgufFile& f;
  const uint8_t* base;  // start of the file
  std::string path;

  // The tensor `name` viewed as `shape` (outermost first, the reverse of ggml's ne).
  Result<Tensor> Get(const std::string& name, std::vector<int64_t> shape, bool optional) const {
    const GgufTensorInfo* t = f.FindTensor(name);
    if (t == nullptr) {
      if (optional) return Tensor{};
      return Status::NotFound(path + ": missing tensor " + name);
    }
    Tensor out;
    switch (t->ggml_type) {
      case kGgmlF32:
        out.dtype = kernels::DType::kF32;
        break;
      case kGgmlF16:
        out.dtype = kernels::DType::kF16;
        break;
      case kGgmlBF16:
        out.dtype = kernels::DType::kBF16;
        break;
      default:
        return Status::Unsupported(path + ": tensor " + name + " has type " +
                                   GgmlTypeName(t->ggml_type) +
                                   "; only F32, F16 and BF16 tensors are supported");
    }
    std::vector<int64_t> have(t->ne.rbegin(), t->ne.rend());
    // Trailing ggml dims of 1 do not change the layout.
    while (have.size() > shape.size() && have.front() == 1) have.erase(have.begin());
    if (have != shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string o = "[";
        for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
        return o + "]";
      };
      return Status::InvalidArgument(path + ": tensor " + name + " has shape " + str(have) +
                                     ", the config implies " + str(shape));
    }
    const uint64_t at = f.data_offset + t->offset;
    if (at % (out.dtype == kernels::DType::kF32 ? 4 : 2) != 0) {
      return Status::Unsupported(path + ": tensor " + name + " at file offset " +
                                 std::to_string(at) + " is not aligned to its element size");
    }
    out.shape = std::move(shape);
    out.data = base + at;
    return out;
  }
};

Result<int32_t> GetPositive(const GgufFile& f, const std::string& key) {
  BR_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("gguf: " + key + " = " + std::to_string(v) + " is out of range");
  }
  return int32_t(v);
}

}  // namespace

Result<ModelWeights> LoadGguf(const std::string& path, const GgufLoadOptions& options) {
  BR_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map, MapFile(path));
  Result<GgufFile> parsed = ParseGguf(map->data, map->size);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  const GgufFile& f = *parsed;
  auto ctx = [&](Status s) { return s.WithContext(path); };

  Result<std::string> arch_r = f.GetString("general.architecture");
  if (!arch_r.ok()) return ctx(arch_r.status());
  const std::string arch = *arch_r;
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe") {
    return Status::Unsupported(path + ": architecture \"" + arch +
                               "\" is not supported (llama, qwen2, qwen3 and qwen3moe are)");
  }
  const bool qwen3 = arch == "qwen3" || arch == "qwen3moe";
  ModelConfig c;
  c.arch = arch == "qwen3moe" ? "qwen3_moe" : arch;
  const std::string p = arch + ".";
  struct {
    const char* key;
    int32_t* dst;
  } ints[] = {{"embedding_length", &c.dim},
              {"feed_forward_length", &c.hidden_dim},
              {"block_count", &c.n_layers},
              {"attention.head_count", &c.n_heads},
              {"context_length", &c.max_seq_len}};
  for (auto& kv : ints) {
    Result<int32_t> v = GetPositive(f, p + kv.key);
    if (!v.ok()) return ctx(v.status());
    *kv.dst = *v;
  }
  c.n_kv_heads = c.n_heads;
  if (f.Find(p + "attention.head_count_kv") != nullptr) {
    Result<int32_t> v = GetPositive(f, p + "attention.head_count_kv");
    if (!v.ok()) return ctx(v.status());
    c.n_kv_heads = *v;
  }
  if (f.Find(p + "rope.freq_base") != nullptr) {
    Result<double> v = f.GetFloat(p + "rope.freq_base");
    if (!v.ok()) return ctx(v.status());
    c.rope_theta = float(*v);
  }
  {
    Result<double> v = f.GetFloat(p + "attention.layer_norm_rms_epsilon");
    if (!v.ok()) return ctx(v.status());
    c.norm_eps = float(*v);
  }
  if (f.Find(p + "rope.scaling.type") != nullptr) {
    Result<std::string> v = f.GetString(p + "rope.scaling.type");
    if (!v.ok()) return ctx(v.status());
    if (*v != "none") {
      return Status::Unsupported(path + ": RoPE scaling \"" + *v + "\" is not supported");
    }
  }
  if (qwen3) {  // QK-norm; attention.key_length may set a head_dim apart from dim / heads
    c.qk_norm = true;
    if (f.Find(p + "attention.key_length") != nullptr) {
      Result<int32_t> v = GetPositive(f, p + "attention.key_length");
      if (!v.ok()) return ctx(v.status());
      if (int64_t(*v) * c.n_heads != c.dim) c.head_size = *v;
    }
  }
  if (arch == "qwen3moe") {
    for (auto [key, dst] : {std::pair{"expert_count", &c.n_experts},
                            std::pair{"expert_used_count", &c.n_experts_per_tok},
                            std::pair{"expert_feed_forward_length", &c.moe_hidden_dim}}) {
      Result<int32_t> v = GetPositive(f, p + key);
      if (!v.ok()) return ctx(v.status());
      *dst = *v;
    }
    c.norm_topk_prob = true;  // llama.cpp's qwen3moe renormalises the top-k weights
  }
  if (c.n_heads > 0 && f.Find(p + "rope.dimension_count") != nullptr &&
      (c.head_size > 0 || c.dim % c.n_heads == 0)) {
    Result<int64_t> v = f.GetInt(p + "rope.dimension_count");
    if (!v.ok()) return ctx(v.status());
    if (*v != c.head_dim()) {
      return Status::Unsupported(path + ": partial RoPE (rope.dimension_count " +
                                 std::to_string(*v) + ", head_dim " + std::to_string(c.head_dim()) +
                                 ") is not supported");
    }
  }
  if (options.max_seq_len > 0) c.max_seq_len = std::min(c.max_seq_len, options.max_seq_len);
  c.rope_layout =
      arch == "llama" ? kernels::RopeLayout::kInterleaved : kernels::RopeLayout::kHalfSplit;
  c.qkv_bias = arch == "qwen2";
  // The vocabulary size is the embedding's row count.
  const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
  if (emb == nullptr) return Status::NotFound(path + ": missing tensor token_embd.weight");
  if (emb->ne.size() < 2 || emb->ne[1] > uint64_t(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument(path + ": token_embd.weight is not a [vocab, dim] matrix");
  }
  c.vocab_size = int32_t(emb->ne[1]);
  c.bos_id = 1;
  c.eos_id = 2;
  for (auto [key, dst] : {std::pair{"tokenizer.ggml.bos_token_id", &c.bos_id},
                          std::pair{"tokenizer.ggml.eos_token_id", &c.eos_id}}) {
    if (f.Find(key) == nullptr) continue;
    Result<int64_t> v = f.GetInt(key);
    if (!v.ok()) return ctx(v.status());
    if (*v < 0 || *v >= c.vocab_size) {
      return Status::InvalidArgument(path + ": " + key + " = " + std::to_string(*v) +
                                     " outside the vocabulary of " + std::to_string(c.vocab_size));
    }
    *dst = int32_t(*v);
  }
  c.shared_classifier = f.FindTensor("output.weight") == nullptr;
  {
    Status s = c.Validate();
    if (!s.ok()) return s.WithContext(path + " (gguf metadata)");
  }

  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  const int64_t qd = c.q_dim(), hd = c.head_dim();
  Mapper m{f, map->data, path};
  ModelWeights w;
  w.config = c;
  w.storage = map;
  w.source = "gguf:" + PathBaseName(path);
  BR_ASSIGN_OR_RETURN(w.token_embedding, m.Get("token_embd.weight", {vocab, dim}, false));
  w.layers.resize(size_t(c.n_layers));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    BR_ASSIGN_OR_RETURN(L.attn_norm, m.Get(b + "attn_norm.weight", {dim}, false));
    BR_ASSIGN_OR_RETURN(L.wq, m.Get(b + "attn_q.weight", {qd, dim}, false));
    BR_ASSIGN_OR_RETURN(L.wk, m.Get(b + "attn_k.weight", {kv, dim}, false));
    BR_ASSIGN_OR_RETURN(L.wv, m.Get(b + "attn_v.weight", {kv, dim}, false));
    if (c.qkv_bias) {
      BR_ASSIGN_OR_RETURN(L.bq, m.Get(b + "attn_q.bias", {qd}, false));
      BR_ASSIGN_OR_RETURN(L.bk, m.Get(b + "attn_k.bias", {kv}, false));
      BR_ASSIGN_OR_RETURN(L.bv, m.Get(b + "attn_v.bias", {kv}, false));
    }
    BR_ASSIGN_OR_RETURN(L.wo, m.Get(b + "attn_output.weight", {dim, qd}, false));
    if (c.qk_norm) {
      BR_ASSIGN_OR_RETURN(L.q_norm, m.Get(b + "attn_q_norm.weight", {hd}, false));
      BR_ASSIGN_OR_RETURN(L.k_norm, m.Get(b + "attn_k_norm.weight", {hd}, false));
    }
    BR_ASSIGN_OR_RETURN(L.ffn_norm, m.Get(b + "ffn_norm.weight", {dim}, false));
    if (c.is_moe()) {
      // Experts are stacked: ffn_{gate,up}_exps [E][ff][dim], ffn_down_exps [E][dim][ff]; each
      // expert is a view of its slice.
      const int64_t ne = c.n_experts, ff = c.moe_hidden_dim;
      BR_ASSIGN_OR_RETURN(L.router, m.Get(b + "ffn_gate_inp.weight", {ne, dim}, false));
      BR_ASSIGN_OR_RETURN(Tensor gate, m.Get(b + "ffn_gate_exps.weight", {ne, ff, dim}, false));
      BR_ASSIGN_OR_RETURN(Tensor up, m.Get(b + "ffn_up_exps.weight", {ne, ff, dim}, false));
      BR_ASSIGN_OR_RETURN(Tensor down, m.Get(b + "ffn_down_exps.weight", {ne, dim, ff}, false));
      auto slice = [](const Tensor& t, int64_t e, std::vector<int64_t> shape) {
        Tensor out = t;
        out.shape = std::move(shape);
        out.data = static_cast<const uint8_t*>(t.data) + e * out.size_bytes();
        return out;
      };
      L.experts.resize(size_t(ne));
      for (int64_t e = 0; e < ne; ++e) {
        L.experts[size_t(e)].w1 = slice(gate, e, {ff, dim});
        L.experts[size_t(e)].w2 = slice(down, e, {dim, ff});
        L.experts[size_t(e)].w3 = slice(up, e, {ff, dim});
      }
      continue;
    }
    BR_ASSIGN_OR_RETURN(L.w1, m.Get(b + "ffn_gate.weight", {hidden, dim}, false));
    BR_ASSIGN_OR_RETURN(L.w2, m.Get(b + "ffn_down.weight", {dim, hidden}, false));
    BR_ASSIGN_OR_RETURN(L.w3, m.Get(b + "ffn_up.weight", {hidden, dim}, false));
  }
  BR_ASSIGN_OR_RETURN(w.final_norm, m.Get("output_norm.weight", {dim}, false));
  if (c.shared_classifier) {
    w.classifier = w.token_embedding;
  } else {
    BR_ASSIGN_OR_RETURN(w.classifier, m.Get("output.weight", {vocab, dim}, false));
  }
  w.weights_hash = HashWeights(w);
  return w;
}

// ---------------------------------------------------------------------------------------------
// The embedded SentencePiece vocabulary.

Result<std::unique_ptr<Tokenizer>> GgufTokenizer(const GgufFile& f, int32_t expected_vocab_size) {
  const GgufValue* model = f.Find("tokenizer.ggml.model");
  if (model == nullptr) return Status::NotFound("gguf: no tokenizer.ggml.model metadata");
  if (model->type != GgufType::kString) {
    return Status::Corruption("gguf: tokenizer.ggml.model is not a string");
  }
  if (model->str != "llama") {
    return Status::Unsupported("gguf: tokenizer model \"" + model->str +
                               "\" is not supported (only the SentencePiece \"llama\" model)");
  }
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  const GgufValue* scores = f.Find("tokenizer.ggml.scores");
  const GgufValue* types = f.Find("tokenizer.ggml.token_type");
  if (tokens == nullptr) return Status::NotFound("gguf: no tokenizer.ggml.tokens metadata");
  if (tokens->type != GgufType::kArray || tokens->elem_type != GgufType::kString ||
      tokens->array.empty()) {
    return Status::Corruption("gguf: tokenizer.ggml.tokens is not a non-empty array of strings");
  }
  const size_t n = tokens->array.size();
  if (scores != nullptr && (scores->type != GgufType::kArray ||
                            scores->elem_type != GgufType::kFloat32 || scores->array.size() != n)) {
    return Status::Corruption("gguf: tokenizer.ggml.scores is not an array of " +
                              std::to_string(n) + " float32");
  }
  if (types != nullptr &&
      (types->type != GgufType::kArray ||
       (types->elem_type != GgufType::kInt32 && types->elem_type != GgufType::kUint32) ||
       types->array.size() != n)) {
    return Status::Corruption("gguf: tokenizer.ggml.token_type is not an array of " +
                              std::to_string(n) + " int32");
  }
  if (expected_vocab_size != 0 && int64_t(n) != expected_vocab_size) {
    return Status::InvalidArgument("gguf: tokenizer has " + std::to_string(n) +
                                   " tokens, model expects " + std::to_string(expected_vocab_size));
  }
  std::vector<std::string> pieces(n);
  std::vector<float> sc(n, 0.0f);
  static const std::string kSpm = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
  for (size_t i = 0; i < n; ++i) {
    const std::string& s = tokens->array[i].str;
    std::string& out = pieces[i];
    out.reserve(s.size());
    for (size_t j = 0; j < s.size();) {
      if (s.compare(j, kSpm.size(), kSpm) == 0) {
        out += ' ';
        j += kSpm.size();
      } else {
        out += s[j++];
      }
    }
    if (scores != nullptr) sc[i] = float(scores->array[i].f64);
    if (types != nullptr) {
      const GgufValue& t = types->array[i];
      const int64_t ty = t.type == GgufType::kInt32 ? t.i64 : int64_t(t.u64);
      if (ty != 1 && ty != 4) sc[i] = -std::numeric_limits<float>::infinity();  // not mergeable
    }
  }
  int32_t ids[2] = {1, 2};
  const char* keys[2] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
  for (int k = 0; k < 2; ++k) {
    if (f.Find(keys[k]) == nullptr) continue;
    BR_ASSIGN_OR_RETURN(int64_t v, f.GetInt(keys[k]));
    if (v < 0 || v >= int64_t(n)) {
      return Status::Corruption(std::string("gguf: ") + keys[k] + " = " + std::to_string(v) +
                                " outside the vocabulary of " + std::to_string(n));
    }
    ids[k] = int32_t(v);
  }
  return MakeLlama2cTokenizer(std::move(pieces), std::move(sc), ids[0], ids[1]);
}

Result<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path,
                                                     int32_t expected_vocab_size) {
  BR_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map, MapFile(path));
  Result<GgufFile> parsed = ParseGguf(map->data, map->size);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  Result<std::unique_ptr<Tokenizer>> t = GgufTokenizer(*parsed, expected_vocab_size);
  if (!t.ok()) return t.status().WithContext(path);
  return t;
}

}  // namespace bitroll::engine
