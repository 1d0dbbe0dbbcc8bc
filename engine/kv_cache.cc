#include "engine/kv_cache.h"

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

namespace {
int32_t PoolLayers(const KvCacheOptions& o, KvPool pool) {
  if (o.layer_sliding.empty()) return pool == KvPool::kFull ? o.n_layers : 0;
  int32_t n = 0;
  for (uint8_t s : o.layer_sliding) n += (s != 0) == (pool == KvPool::kSliding) ? 1 : 0;
  return n;
}
}  // namespace

int64_t KvCache::BlockBytes(const KvCacheOptions& o, KvPool pool) {
  return int64_t{2} * PoolLayers(o, pool) * o.n_kv_heads * o.head_dim * o.block_size *
         ElemBytes(o.dtype);
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const Pool& p : pools_) n += static_cast<int64_t>(p.k.size() + p.v.size());
  return n;
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
  if (!o.layer_sliding.empty()) {
    if (static_cast<int32_t>(o.layer_sliding.size()) != o.n_layers ||
        PoolLayers(o, KvPool::kFull) == 0 || PoolLayers(o, KvPool::kSliding) == 0 ||
        o.num_sliding_blocks <= 0 || o.num_sliding_blocks > (int64_t{1} << 30)) {
      return Status::InvalidArgument(
          "kv cache: layer_sliding needs n_layers entries, layers of both kinds and "
          "num_sliding_blocks in [1, 2^30]");
    }
  }
  std::unique_ptr<KvCache> c(new KvCache(o));
  c->elem_ = ElemBytes(o.dtype);
  c->layer_pool_.resize(static_cast<size_t>(o.n_layers), KvPool::kFull);
  c->layer_index_.resize(static_cast<size_t>(o.n_layers));
  for (int32_t l = 0; l < o.n_layers; ++l) {
    const KvPool k =
        !o.layer_sliding.empty() && o.layer_sliding[l] != 0 ? KvPool::kSliding : KvPool::kFull;
    c->layer_pool_[l] = k;
    c->layer_index_[l] = c->P(k).n_layers++;
  }
  c->P(KvPool::kFull).num_blocks = o.num_blocks;
  c->P(KvPool::kSliding).num_blocks = o.layer_sliding.empty() ? 0 : o.num_sliding_blocks;
  for (Pool& p : c->pools_) {
    if (p.n_layers == 0) continue;
    p.layer_stride = p.num_blocks * o.n_kv_heads * o.head_dim * o.block_size * c->elem_;
    // Zero-filled: slots beyond a sequence's length are never read as values, but the SIMD score
    // loop loads whole chunks, so they must hold finite numbers.
    const auto bytes = static_cast<size_t>(p.layer_stride * p.n_layers);
    if (!p.k.Map(bytes, /*huge_pages=*/false) || !p.v.Map(bytes, /*huge_pages=*/false)) {
      return Status::ResourceExhausted("kv cache: cannot allocate " + std::to_string(2 * bytes) +
                                       " bytes");
    }
    p.refs.assign(static_cast<size_t>(p.num_blocks), 0);
    p.free.reserve(static_cast<size_t>(p.num_blocks));
    for (int64_t b = p.num_blocks - 1; b >= 0; --b) p.free.push_back(static_cast<int32_t>(b));
  }
  return c;
}

Result<int32_t> KvCache::Allocate(KvPool pool) {
  Pool& p = P(pool);
  if (p.free.empty()) return Status::ResourceExhausted("kv cache: no free block");
  const int32_t b = p.free.back();
  p.free.pop_back();
  p.refs[b] = 1;
  return b;
}

void KvCache::Retain(int32_t block, KvPool pool) {
  ++P(pool).refs[block];
}

void KvCache::Release(int32_t block, KvPool pool) {
  Pool& p = P(pool);
  if (--p.refs[block] == 0) p.free.push_back(block);
}

const void* KvCache::k_layer(int32_t layer) const {
  const Pool& p = P(layer_pool_[layer]);
  return p.k.data() + layer_index_[layer] * p.layer_stride;
}

const void* KvCache::v_layer(int32_t layer) const {
  const Pool& p = P(layer_pool_[layer]);
  return p.v.data() + layer_index_[layer] * p.layer_stride;
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
               const float* k, const float* v, int32_t head0, int32_t heads) {
  const int32_t hd = o.head_dim;
  const int32_t bs = o.block_size;
  for (int32_t h = head0; h < head0 + heads; ++h) {
    T* kb = reinterpret_cast<T*>(kpool) + int64_t{h} * hd * bs;  // [head_dim][block_size]
    T* vb = reinterpret_cast<T*>(vpool) + int64_t{h} * hd * bs;  // [block_size][head_dim]
    for (int32_t d = 0; d < hd; ++d) {
      kb[d * bs + slot] = Stored<T>(k[h * hd + d]);
      vb[slot * hd + d] = Stored<T>(v[h * hd + d]);
    }
  }
}
}  // namespace

void KvCache::Write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v,
                    int32_t head0, int32_t heads) {
  Pool& p = P(layer_pool_[layer]);
  const int64_t base = layer_index_[layer] * p.layer_stride +
                       int64_t{block} * opt_.n_kv_heads * opt_.head_dim * opt_.block_size * elem_;
  if (opt_.dtype == DType::kBF16) {
    WriteSlot<uint16_t>(opt_, p.k.data() + base, p.v.data() + base, slot, k, v, head0, heads);
  } else {
    WriteSlot<float>(opt_, p.k.data() + base, p.v.data() + base, slot, k, v, head0, heads);
  }
}

void KvCache::CopyBlock(int32_t src, int32_t dst, KvPool pool) {
  if (store_ != nullptr && pool == KvPool::kFull) {
    store_->CopyBlock(src, dst);
    return;
  }
  Pool& p = P(pool);
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const int64_t base = l * p.layer_stride;
    std::memcpy(p.k.data() + base + dst * per, p.k.data() + base + src * per, per);
    std::memcpy(p.v.data() + base + dst * per, p.v.data() + base + src * per, per);
  }
}

void KvCache::ExportBlock(int32_t block, float* out, KvPool pool) const {
  if (store_ != nullptr && pool == KvPool::kFull) {
    store_->ExportBlock(block, out);
    return;
  }
  const Pool& p = P(pool);
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  auto* o = reinterpret_cast<unsigned char*>(out);
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const int64_t base = l * p.layer_stride + block * per;
    std::memcpy(o + (2 * l) * per, p.k.data() + base, per);
    std::memcpy(o + (2 * l + 1) * per, p.v.data() + base, per);
  }
}

void KvCache::ImportBlock(int32_t block, const float* in, KvPool pool) {
  if (store_ != nullptr && pool == KvPool::kFull) {
    store_->ImportBlock(block, in);
    return;
  }
  Pool& p = P(pool);
  const int64_t per = int64_t{opt_.n_kv_heads} * opt_.head_dim * opt_.block_size * elem_;
  const auto* i = reinterpret_cast<const unsigned char*>(in);
  for (int32_t l = 0; l < p.n_layers; ++l) {
    const int64_t base = l * p.layer_stride + block * per;
    std::memcpy(p.k.data() + base, i + (2 * l) * per, per);
    std::memcpy(p.v.data() + base, i + (2 * l + 1) * per, per);
  }
}

}  // namespace bitroll::engine
