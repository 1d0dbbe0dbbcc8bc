#include "engine/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/math.h"

namespace bitroll::engine {

namespace {
int64_t ElemBytes(DType t) {
  return t == DType::kBF16 ? 2 : 4;
}
}  // namespace

int64_t KvCache::BlockBytes(const KvCacheOptions& o) {
  return int64_t{2} * o.n_layers * o.n_kv_heads * o.head_dim * o.block_size * ElemBytes(o.dtype);
}

Result<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& o) {
  if (o.n_layers <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.num_blocks <= 0 ||
      o.num_blocks > (int64_t{1} << 30)) {
    return Status::InvalidArgument("kv cache: bad shape (layers " + std::to_string(o.n_layers) +
                                   ", kv heads " + std::to_string(o.n_kv_heads) + ", head_dim " +
                                   std::to_string(o.head_dim) + ", blocks " +
                                   std::to_string(o.num_blocks) + ")");
  }
  if (o.block_size <= 0 || o.block_size % kernels::kAttentionChunk != 0) {
    return Status::InvalidArgument("kv cache: block_size " + std::to_string(o.block_size) +
                                   " is not a positive multiple of the attention chunk " +
                                   std::to_string(kernels::kAttentionChunk));
  }
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16) {
    return Status::InvalidArgument("kv cache: element type must be f32 or bf16");
  }
  std::unique_ptr<KvCache> c(new KvCache(o));
  c->elem_ = ElemBytes(o.dtype);
  c->layer_stride_ = o.num_blocks * o.n_kv_heads * o.head_dim * o.block_size * c->elem_;
  // Zero-filled: slots beyond a sequence's length are never read as values, but the SIMD score
  // loop loads whole chunks, so they must hold finite numbers.
  const auto bytes = static_cast<size_t>(c->layer_stride_ * o.n_layers);
  if (!c->k_.Map(bytes) || !c->v_.Map(bytes)) {
    return Status::ResourceExhausted("kv cache: cannot allocate " +
                                     std::to_string(BlockBytes(o) * o.num_blocks) + " bytes");
  }
  c->refs_.assign(static_cast<size_t>(o.num_blocks), 0);
  c->free_.reserve(static_cast<size_t>(o.num_blocks));
  for (int64_t b = o.num_blocks - 1; b >= 0; --b) c->free_.push_back(static_cast<int32_t>(b));
  return c;
}

KvCache::ZeroPages::~ZeroPages() {
  if (p_ != nullptr) munmap(p_, std::max<size_t>(n_, 1));
}

bool KvCache::ZeroPages::Map(size_t bytes) {
  void* p = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  p_ = static_cast<unsigned char*>(p);
  n_ = bytes;
  return true;
}

Result<int32_t> KvCache::Allocate() {
  if (free_.empty()) return Status::ResourceExhausted("kv cache: no free block");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void KvCache::Retain(int32_t block) {
  ++refs_[block];
}

void KvCache::Release(int32_t block) {
  if (--refs_[block] == 0) free_.push_back(block);
}

namespace {
template <typename T>
T Stored(float x);
template <>
float Stored<float>(float x) {
  return x;
}
template <>
uint16_t Stored<uint16_t>(float x) {
  return kernels::F32ToBf16(x);
}

template <typename T>
void WriteSlot(const KvCacheOptions& o, unsigned char* kpool, unsigned char* vpool, int32_t slot,
               const float* k, const float* v) {
  const int32_t hd = o.head_dim;
  const int32_t bs = o.block_size;
  for (int32_t h = 0; h < o.n_kv_heads; ++h) {
    T* kb = reinterpret_cast<T*>(kpool) + int64_t{h} * hd * bs;  // [head_dim][block_size]
    T* vb = reinterpret_cast<T*>(vpool) + int64_t{h} * hd * bs;  // [block_size][head_dim]
    for (int32_t d = 0; d < hd; ++d) {
      kb[d * bs + slot] = Stored<T>(k[h * hd + d]);
      vb[slot * hd + d] = Stored<T>(v[h * hd + d]);
    }
  }
}
}  // namespace

void KvCache::Write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v) {
  const int64_t base = layer * layer_stride_ +
                       int64_t{block} * opt_.n_kv_heads * opt_.head_dim * opt_.block_size * elem_;
  if (opt_.dtype == DType::kBF16) {
    WriteSlot<uint16_t>(opt_, k_.data() + base, v_.data() + base, slot, k, v);
  } else {
    WriteSlot<float>(opt_, k_.data() + base, v_.data() + base, slot, k, v);
  }
}

void KvCache::CopyBlock(int32_t src, int32_t dst) {
  if (store_ != nullptr) {
    store_->CopyBlock(src, dst);
    return;
  }
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  for (int32_t l = 0; l < opt_.n_layers; ++l) {
    const int64_t base = l * layer_stride_;
    std::memcpy(k_.data() + base + dst * per, k_.data() + base + src * per, per);
    std::memcpy(v_.data() + base + dst * per, v_.data() + base + src * per, per);
  }
}

void KvCache::ExportBlock(int32_t block, float* out) const {
  if (store_ != nullptr) {
    store_->ExportBlock(block, out);
    return;
  }
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  auto* o = reinterpret_cast<unsigned char*>(out);
  for (int32_t l = 0; l < opt_.n_layers; ++l) {
    const int64_t base = l * layer_stride_ + block * per;
    std::memcpy(o + (2 * l) * per, k_.data() + base, per);
    std::memcpy(o + (2 * l + 1) * per, v_.data() + base, per);
  }
}

void KvCache::ImportBlock(int32_t block, const float* in) {
  if (store_ != nullptr) {
    store_->ImportBlock(block, in);
    return;
  }
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  const auto* i = reinterpret_cast<const unsigned char*>(in);
  for (int32_t l = 0; l < opt_.n_layers; ++l) {
    const int64_t base = l * layer_stride_ + block * per;
    std::memcpy(k_.data() + base, i + (2 * l) * per, per);
    std::memcpy(v_.data() + base, i + (2 * l + 1) * per, per);
  }
}

}  // namespace bitroll::engine
