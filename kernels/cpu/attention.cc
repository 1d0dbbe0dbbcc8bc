// Attention: the scalar chunk partial, the merge, and the single-worker / split-tail drivers.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/math.h"

namespace bitroll::kernels {

const char* AttentionKernelName(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kSingle:
      return "single";
    case AttentionKernel::kSplit:
      return "split";
  }
  return "unknown";
}

namespace internal {

// deterministic: the canonical per-chunk order of attention.h, written out plainly.
void ChunkPartialScalar(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out) {
  const ChunkView c = ViewChunk(p, kvh, blocks, position, chunk);
  const int32_t hd = p.head_dim;
  float s[kAttentionChunk];
  for (int32_t j = 0; j < kAttentionChunk; ++j) {
    if (j >= c.n_valid) {
      s[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float acc = 0.0f;
    for (int32_t d = 0; d < hd; ++d) acc = std::fma(q[d], c.k[d * p.block_size + j], acc);
    s[j] = acc * p.scale;
  }
  float lane[kAttentionChunk];
  std::memcpy(lane, s, sizeof(s));
  const float m = ReduceMax16(lane);
  float pj[kAttentionChunk];
  for (int32_t j = 0; j < kAttentionChunk; ++j) pj[j] = j < c.n_valid ? Exp(s[j] - m) : 0.0f;
  std::memcpy(lane, pj, sizeof(pj));
  const float l = ReduceSum16(lane);
  out->m = m;
  out->l = l;
  for (int32_t d = 0; d < hd; ++d) out->o[d] = 0.0f;
  for (int32_t j = 0; j < c.n_valid; ++j) {
    const float* v = c.v + static_cast<int64_t>(j) * hd;
    for (int32_t d = 0; d < hd; ++d) out->o[d] = std::fma(pj[j], v[d], out->o[d]);
  }
}

}  // namespace internal

void ChunkPartial(Isa isa, const AttentionParams& p, const float* q, int32_t kvh,
                  const int32_t* blocks, int32_t position, int32_t chunk, AttentionPartial* out) {
  switch (isa) {
    case Isa::kAvx512:
      internal::ChunkPartialAvx512(p, q, kvh, blocks, position, chunk, out);
      return;
    case Isa::kAvx2:
      internal::ChunkPartialAvx2(p, q, kvh, blocks, position, chunk, out);
      return;
    case Isa::kScalar:
      break;
  }
  internal::ChunkPartialScalar(p, q, kvh, blocks, position, chunk, out);
}

// deterministic: element-wise multiplies and adds only (no contraction, no reduction), so the
// compiler's vectorization of these loops cannot change a bit; one version serves every ISA.
void MergePartial(Isa /*isa*/, int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c) {
  const float m = std::max(acc->m, c.m);
  const float a = Exp(acc->m - m);
  const float b = Exp(c.m - m);
  const float la = acc->l * a;
  const float lb = c.l * b;
  acc->l = la + lb;
  for (int32_t d = 0; d < head_dim; ++d) {
    const float oa = acc->o[d] * a;
    const float ob = c.o[d] * b;
    acc->o[d] = oa + ob;
  }
  acc->m = m;
}

void FinishPartial(Isa /*isa*/, int32_t head_dim, const AttentionPartial& acc, float* out) {
  for (int32_t d = 0; d < head_dim; ++d) out[d] = acc.o[d] / acc.l;
}

namespace {

inline int32_t NumChunks(int32_t position) {
  return position / kAttentionChunk + 1;
}

struct Item {
  int32_t token;
  int32_t head;
};

inline Item ItemOf(const AttentionParams& p, int64_t index) {
  return {static_cast<int32_t>(index / p.n_heads), static_cast<int32_t>(index % p.n_heads)};
}

inline const float* QueryOf(const AttentionParams& p, Item it) {
  return p.q + (static_cast<int64_t>(it.token) * p.n_heads + it.head) * p.head_dim;
}

inline float* OutOf(const AttentionParams& p, Item it) {
  return p.out + (static_cast<int64_t>(it.token) * p.n_heads + it.head) * p.head_dim;
}

inline int32_t KvHeadOf(const AttentionParams& p, int32_t head) {
  return head / (p.n_heads / p.n_kv_heads);
}

// The single-worker kernel: all chunks of one item, merged as they are produced.
void RunSingle(Isa isa, const AttentionParams& p, Item it) {
  const int32_t pos = p.positions[it.token];
  const int32_t* blocks = p.block_tables[it.token];
  const float* q = QueryOf(p, it);
  const int32_t kvh = KvHeadOf(p, it.head);
  AttentionPartial acc;
  AttentionPartial part;
  ChunkPartial(isa, p, q, kvh, blocks, pos, 0, &acc);
  const int32_t n = NumChunks(pos);
  for (int32_t c = 1; c < n; ++c) {
    ChunkPartial(isa, p, q, kvh, blocks, pos, c, &part);
    MergePartial(isa, p.head_dim, &acc, part);
  }
  FinishPartial(isa, p.head_dim, acc, OutOf(p, it));
}

}  // namespace

void Attention(Isa isa, const AttentionParams& p, AttentionKernel kernel, ThreadPool* pool,
               AttentionScratch* scratch) {
  const int64_t n_items = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  if (n_items == 0) return;
  const int workers = pool != nullptr ? pool->size() : 1;

  // Which items run split. kAuto: the tail of the last wave, when there are idle workers for it.
  int64_t first_split = n_items;
  if (kernel == AttentionKernel::kSplit) {
    first_split = 0;
  } else if (kernel == AttentionKernel::kAuto && workers > 1) {
    const int64_t tail = n_items < workers ? n_items : n_items % workers;
    first_split = n_items - tail;
  }

  // Split items: one task per chunk, partials laid out item-major in the scratch.
  std::vector<int64_t> split_items;
  std::vector<int64_t> chunk_base;  // first partial of each split item
  int64_t n_partials = 0;
  for (int64_t i = first_split; i < n_items; ++i) {
    const int32_t n = NumChunks(p.positions[ItemOf(p, i).token]);
    if (n < 2 && kernel != AttentionKernel::kSplit) continue;
    split_items.push_back(i);
    chunk_base.push_back(n_partials);
    n_partials += n;
  }
  std::vector<uint8_t> is_split(n_items - first_split, 0);
  for (int64_t i : split_items) is_split[i - first_split] = 1;
  std::vector<int64_t> single_items;
  single_items.reserve(n_items - split_items.size());
  for (int64_t i = 0; i < n_items; ++i) {
    if (i < first_split || !is_split[i - first_split]) single_items.push_back(i);
  }

  AttentionScratch local;
  AttentionScratch* s = scratch != nullptr ? scratch : &local;
  if (static_cast<int64_t>(s->partials.size()) < n_partials) s->partials.resize(n_partials);

  // Phase 1: single-worker items, and every chunk of every split item.
  const int64_t n_single = static_cast<int64_t>(single_items.size());
  const int64_t n_tasks = n_single + n_partials;
  auto phase1 = [&](int /*worker*/, int64_t task) {
    if (task < n_single) {
      RunSingle(isa, p, ItemOf(p, single_items[task]));
      return;
    }
    const int64_t part = task - n_single;
    // The split item owning this partial: the last chunk_base <= part.
    const int64_t k =
        std::upper_bound(chunk_base.begin(), chunk_base.end(), part) - chunk_base.begin() - 1;
    const Item it = ItemOf(p, split_items[k]);
    const int32_t chunk = static_cast<int32_t>(part - chunk_base[k]);
    ChunkPartial(isa, p, QueryOf(p, it), KvHeadOf(p, it.head), p.block_tables[it.token],
                 p.positions[it.token], chunk, &s->partials[part]);
  };
  // Phase 2: one worker per split item merges its partials left to right.
  auto phase2 = [&](int /*worker*/, int64_t k) {
    const Item it = ItemOf(p, split_items[k]);
    const int32_t n = NumChunks(p.positions[it.token]);
    AttentionPartial acc = s->partials[chunk_base[k]];
    for (int32_t c = 1; c < n; ++c)
      MergePartial(isa, p.head_dim, &acc, s->partials[chunk_base[k] + c]);
    FinishPartial(isa, p.head_dim, acc, OutOf(p, it));
  };
  const int64_t n_split = static_cast<int64_t>(split_items.size());
  if (pool != nullptr && workers > 1) {
    pool->Run(n_tasks, phase1);
    if (n_split > 0) pool->Run(n_split, phase2);
  } else {
    for (int64_t t = 0; t < n_tasks; ++t) phase1(0, t);
    for (int64_t k = 0; k < n_split; ++k) phase2(0, k);
  }
}

void AttentionReference(const AttentionParams& p) {
  for (int64_t i = 0; i < static_cast<int64_t>(p.n_tokens) * p.n_heads; ++i) {
    const Item it = ItemOf(p, i);
    const int32_t pos = p.positions[it.token];
    const float* q = QueryOf(p, it);
    const int32_t kvh = KvHeadOf(p, it.head);
    AttentionPartial acc;
    AttentionPartial part;
    internal::ChunkPartialScalar(p, q, kvh, p.block_tables[it.token], pos, 0, &acc);
    for (int32_t c = 1; c < NumChunks(pos); ++c) {
      internal::ChunkPartialScalar(p, q, kvh, p.block_tables[it.token], pos, c, &part);
      MergePartial(Isa::kScalar, p.head_dim, &acc, part);
    }
    FinishPartial(Isa::kScalar, p.head_dim, acc, OutOf(p, it));
  }
}

}  // namespace bitroll::kernels
