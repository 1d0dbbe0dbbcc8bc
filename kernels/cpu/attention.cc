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

namespace {

// A K/V element as fp32: bf16 widens exactly.
inline float KvValue(float x) {
  return x;
}
inline float KvValue(uint16_t x) {
  return Bf16ToF32(x);
}

// deterministic: the canonical per-chunk order of attention.h, written out plainly.
// Keys j < first (chunk-relative) are masked as the keys beyond the causal edge are.
template <typename T>
void ChunkPartialScalarT(const AttentionParams& p, const float* q, int32_t kvh,
                         const int32_t* blocks, int32_t position, int32_t chunk,
                         AttentionPartial* out, int32_t first = 0) {
  const ChunkView<T> c = ViewChunk<T>(p, kvh, blocks, position, chunk);
  const int32_t hd = p.head_dim;
  float s[kAttentionChunk];
  for (int32_t j = 0; j < kAttentionChunk; ++j) {
    if (j >= c.n_valid || j < first) {
      s[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float acc = 0.0f;
    for (int32_t d = 0; d < hd; ++d) {
      acc = std::fma(q[d], KvValue(c.k[d * p.block_size + j]), acc);
    }
    s[j] = acc * p.scale;
  }
  float lane[kAttentionChunk];
  std::memcpy(lane, s, sizeof(s));
  const float m = ReduceMax16(lane);
  float pj[kAttentionChunk];
  for (int32_t j = 0; j < kAttentionChunk; ++j) {
    pj[j] = j < c.n_valid && j >= first ? Exp(s[j] - m) : 0.0f;
  }
  std::memcpy(lane, pj, sizeof(pj));
  const float l = ReduceSum16(lane);
  out->m = m;
  out->l = l;
  for (int32_t d = 0; d < hd; ++d) out->o[d] = 0.0f;
  for (int32_t j = first; j < c.n_valid; ++j) {
    const T* v = c.v + static_cast<int64_t>(j) * hd;
    for (int32_t d = 0; d < hd; ++d) out->o[d] = std::fma(pj[j], KvValue(v[d]), out->o[d]);
  }
}

}  // namespace

void ChunkPartialScalar(const AttentionParams& p, const float* q, int32_t kvh,
                        const int32_t* blocks, int32_t position, int32_t chunk,
                        AttentionPartial* out) {
  if (p.kv_dtype == DType::kBF16) {
    ChunkPartialScalarT<uint16_t>(p, q, kvh, blocks, position, chunk, out);
  } else {
    ChunkPartialScalarT<float>(p, q, kvh, blocks, position, chunk, out);
  }
}

void ChunkPartialWindowScalar(const AttentionParams& p, const float* q, int32_t kvh,
                              const int32_t* blocks, int32_t position, int32_t lo, int32_t chunk,
                              AttentionPartial* out) {
  const int32_t first = std::max(0, lo - chunk * kAttentionChunk);
  if (p.kv_dtype == DType::kBF16) {
    ChunkPartialScalarT<uint16_t>(p, q, kvh, blocks, position, chunk, out, first);
  } else {
    ChunkPartialScalarT<float>(p, q, kvh, blocks, position, chunk, out, first);
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
// compiler's vectorization of these loops cannot change a bit. The AVX2 / AVX-512 twins
// (attention_avx*.cc) run these same operations with inlined hardware fma in Exp().
void MergePartial(Isa isa, int32_t head_dim, AttentionPartial* acc, const AttentionPartial& c) {
  switch (isa) {
    case Isa::kAvx512:
      internal::MergePartialAvx512(head_dim, acc, c);
      return;
    case Isa::kAvx2:
      internal::MergePartialAvx2(head_dim, acc, c);
      return;
    case Isa::kScalar:
      break;
  }
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

using internal::ChunkJob;
using internal::kMaxChunkJobs;

// Up to this many consecutive query rows of one sequence and head run as one task, so each chunk
// of K/V is loaded once for all of them.
constexpr int32_t kGroupQueries = 8;
// A tile group of fewer rows runs RunSingle instead (most of the tile's lanes would idle).
constexpr int32_t kMinTileQueries = 4;
static_assert(kMinTileQueries <= kGroupQueries, "a group too short for a tile fits RunSingle");
static_assert(kGroupQueries <= internal::kTileRows, "a sibling group without the tile fits");
// A lone decode row's heads (one query head per kv head) run up to this many per task when the
// call has enough rows for every worker to take several tasks, or has one worker; else up to
// kGroupQueries, so that a few rows still spread over every worker. A block's heads are adjacent
// in the pool, so a task with all of a row's heads reads each of its blocks' K and V as one run:
// with 12 heads of 64, 48 KB each instead of two tasks reading 24 KB halves at different times.
// Batch-32 decode, 12 heads: up to 1.07x the step with 6-head tasks (docs/benchmarks.md, "Issue
// 19, round 13").
constexpr int32_t kMaxHeadGroup = 16;
constexpr int32_t kMinTasksPerWorker = 4;
// A walk of at least this many batches of kMaxChunkJobs chunks (512 keys) is long: a lone row
// (one query head per kv head) with such heads walks them one by one rather than in head groups
// (shorter rows, batch-32 decode at a few hundred keys, keep their groups), and a query walking
// such chunks alone over fp32 K/V skips the software prefetch (RunSingle).
constexpr int32_t kLoneWalkBatches = 4;
inline bool IsLongWalk(int32_t chunks) {
  return chunks >= kLoneWalkBatches * kMaxChunkJobs;
}
// The most items one RunSingle call takes.
constexpr int32_t kMaxRunItems = std::max(kGroupQueries, kMaxHeadGroup);

// out[i] <- the canonical partial of jobs[i]; bit-identical to ChunkPartial of each job alone.
void ChunkPartialsIsa(Isa isa, const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                      AttentionPartial* out) {
  switch (isa) {
    case Isa::kAvx512:
      internal::ChunkPartialsAvx512(p, jobs, n, out);
      return;
    case Isa::kAvx2:
      internal::ChunkPartialsAvx2(p, jobs, n, out);
      return;
    case Isa::kScalar:
      break;
  }
  for (int32_t i = 0; i < n; ++i) {
    internal::ChunkPartialScalar(p, jobs[i].q, jobs[i].kvh, jobs[i].blocks, jobs[i].position,
                                 jobs[i].chunk, &out[i]);
  }
}

// Jobs whose chunk has keys masked below the window run the shared scalar window code; the rest
// run the ISA's code (same bits as scalar). Which code runs depends only on (position, chunk, W).
void ChunkPartials(Isa isa, const AttentionParams& p, const ChunkJob* jobs, int32_t n,
                   AttentionPartial* out) {
  bool any = false;
  for (int32_t i = 0; i < n; ++i) any = any || jobs[i].lo > jobs[i].chunk * kAttentionChunk;
  if (!any) {
    ChunkPartialsIsa(isa, p, jobs, n, out);
    return;
  }
  ChunkJob plain[kMaxChunkJobs];
  int32_t where[kMaxChunkJobs];
  int32_t n_plain = 0;
  for (int32_t i = 0; i < n; ++i) {
    const ChunkJob& j = jobs[i];
    if (j.lo > j.chunk * kAttentionChunk) {
      internal::ChunkPartialWindowScalar(p, j.q, j.kvh, j.blocks, j.position, j.lo, j.chunk,
                                         &out[i]);
    } else {
      where[n_plain] = i;
      plain[n_plain++] = j;
    }
  }
  if (n_plain == 0) return;
  AttentionPartial tmp[kMaxChunkJobs];
  ChunkPartialsIsa(isa, p, plain, n_plain, tmp);
  for (int32_t k = 0; k < n_plain; ++k) {
    out[where[k]].m = tmp[k].m;
    out[where[k]].l = tmp[k].l;
    std::memcpy(out[where[k]].o, tmp[k].o, sizeof(float) * p.head_dim);
  }
}

// *acc[i] <- merge(*acc[i], c[i]) for i < n (distinct acc[i], n <= kMaxChunkJobs): n
// independent merges, as the lanes of one register with AVX-512 and AVX2 (same bits as
// MergePartial one by one), else one after another.
void MergePartials(Isa isa, int32_t head_dim, int32_t n, AttentionPartial* const* acc,
                   const AttentionPartial* c) {
  switch (isa) {
    case Isa::kAvx512:
      internal::MergePartialsAvx512(head_dim, n, acc, c);
      return;
    case Isa::kAvx2:
      internal::MergePartialsAvx2(head_dim, n, acc, c);
      return;
    case Isa::kScalar:
      break;
  }
  for (int32_t i = 0; i < n; ++i) MergePartial(isa, head_dim, acc[i], c[i]);
}

// acc <- c (the merge's starting state is chunk 0's partial, unchanged).
void CopyPartial(int32_t head_dim, const AttentionPartial& c, AttentionPartial* acc) {
  acc->m = c.m;
  acc->l = c.l;
  std::memcpy(acc->o, c.o, sizeof(float) * head_dim);
}

// One (token, head) item: the tile's lane type, so sibling groups hand their items to it as they
// are.
using Item = internal::TileLane;

using internal::WindowLo;

// Token t's chunks: FirstChunk .. positions[t] / S, NumChunks of them.
inline int32_t FirstChunk(const AttentionParams& p, int32_t token) {
  return WindowLo(p, token) / kAttentionChunk;
}
inline int32_t NumChunks(const AttentionParams& p, int32_t token) {
  return p.positions[token] / kAttentionChunk + 1 - FirstChunk(p, token);
}

// The merge's starting state when the head has a sink: (m = sink, l = 1, o = 0).
inline void SinkPartial(const AttentionParams& p, int32_t head, AttentionPartial* acc) {
  acc->m = p.sinks[head];
  acc->l = 1.0f;
  for (int32_t d = 0; d < p.head_dim; ++d) acc->o[d] = 0.0f;
}

inline Item ItemOf(const AttentionParams& p, int64_t index) {
  return {static_cast<int32_t>(index / p.n_heads), static_cast<int32_t>(index % p.n_heads)};
}

inline const float* QueryOf(const AttentionParams& p, Item it) {
  return p.q + (static_cast<int64_t>(it.row) * p.n_heads + it.head) * p.head_dim;
}

inline float* OutOf(const AttentionParams& p, Item it) {
  return p.out + (static_cast<int64_t>(it.row) * p.n_heads + it.head) * p.head_dim;
}

inline int32_t KvHeadOf(const AttentionParams& p, int32_t head) {
  return head / (p.n_heads / p.n_kv_heads);
}

// The job of token it's rel-th chunk in its window (chunk FirstChunk + rel).
inline ChunkJob JobOf(const AttentionParams& p, Item it, int32_t rel) {
  return {QueryOf(p, it),      p.block_tables[it.row],      KvHeadOf(p, it.head),
          p.positions[it.row], FirstChunk(p, it.row) + rel, WindowLo(p, it.row)};
}

// A kv unit (the query heads of one row that read one kv head) of `heads` heads runs this many
// whole chunks per batch of jobs, so that each chunk's jobs read its K/V together.
inline int32_t KvUnitBatchChunks(int32_t heads) {
  return std::max(1, kMaxChunkJobs / heads);
}

// JobOf for an item with n_chunks chunks that prefetches ahead: it names the chunk `ahead`
// chunks later (one batch for a kv unit or a query walking its chunks alone, RowUnitAhead for a
// row unit), whose K/V the kernel prefetches meanwhile.
inline ChunkJob AheadJobOf(const AttentionParams& p, Item it, int32_t rel, int32_t n_chunks,
                           int32_t ahead) {
  ChunkJob job = JobOf(p, it, rel);
  if (rel + ahead < n_chunks) job.prefetch_chunk = job.chunk + ahead;
  return job;
}

// Whether the items are consecutive heads of one row, each with its own kv head (a row unit: a
// lone decode row's heads, whose K/V each block holds side by side).
inline bool IsRowUnit(const AttentionParams& p, const Item* items, int32_t n) {
  if (n < 2 || p.n_heads != p.n_kv_heads) return false;
  for (int32_t i = 1; i < n; ++i) {
    if (items[i].row != items[0].row || items[i].head != items[0].head + i) return false;
  }
  return true;
}

// A row unit of `heads` heads walks its chunks chunk-major, kMaxChunkJobs jobs per batch; each
// job prefetches its head's chunk this many chunks later, over a batch ahead.
inline int32_t RowUnitAhead(int32_t heads) {
  return (kMaxChunkJobs + heads - 1) / heads + 1;
}

// The single-worker kernel for the items (consecutive tokens of one head and one sequence, or
// consecutive heads of one token, e.g. a kv unit; n_queries <= kMaxRunItems): each item walks all
// its chunks and merges them left to right as they are produced. The items only share the task:
// their chunks are computed up to kMaxChunkJobs at a time (the same chunk of several queries, or
// consecutive chunks of one query; a kv unit's batches hold whole chunks), and each partial is
// merged into its own item's state in chunk order, so every item gets the bits of a one-item,
// one-chunk-at-a-time walk. With `start`, each item resumes that walk after its first `resume`
// chunks: start[i] is item i's running state after them. With `keep`, the walk stops before chunk
// `end` and leaves item i's running state in keep[i] instead of writing its output (the first run
// of a split item's chunks).
void RunSingle(Isa isa, const AttentionParams& p, const Item* items, int32_t n_queries,
               const AttentionPartial* start = nullptr, int32_t resume = 0,
               AttentionPartial* keep = nullptr, int32_t end = 0) {
  AttentionPartial acc[kMaxRunItems];
  AttentionPartial parts[kMaxChunkJobs];
  ChunkJob jobs[kMaxChunkJobs];
  int32_t owner[kMaxChunkJobs];
  int32_t rel[kMaxChunkJobs];  // the job's chunk index within its window
  int32_t n_chunks[kMaxRunItems];
  int32_t max_chunks = 0;
  const bool sink = p.sinks != nullptr;
  for (int32_t i = 0; i < n_queries; ++i) {
    n_chunks[i] = NumChunks(p, items[i].row);
    if (keep != nullptr) n_chunks[i] = std::min(n_chunks[i], end);
    max_chunks = std::max(max_chunks, n_chunks[i]);
    if (start != nullptr) {
      CopyPartial(p.head_dim, start[i], &acc[i]);
    } else if (sink) {
      SinkPartial(p, items[i].head, &acc[i]);
    }
  }
  // Whether the items are a kv unit (then: whole chunks per batch, next batch prefetched).
  bool kv_unit = n_queries > 1;
  for (int32_t i = 1; i < n_queries && kv_unit; ++i) {
    kv_unit =
        items[i].row == items[0].row && KvHeadOf(p, items[i].head) == KvHeadOf(p, items[0].head);
  }
  // A query alone walks kMaxChunkJobs consecutive chunks per batch. Its K/V pieces are a chunk
  // each, spread over blocks far apart. With bf16 K/V a piece is half a page, too short for the
  // hardware prefetchers to run ahead, so the next batch is prefetched as for kv units: bf16
  // decode at 16K keys 1.2x (docs/benchmarks.md, "Issue 19, round 9"). With fp32 K/V a piece is a
  // whole 4 KiB page, which they stream once started: over a long walk (IsLongWalk) prefetching
  // every line (a quarter of the walk's time on chunks in L2) costs more than it saves, and
  // without it the walk reads nearer the machine's bandwidth from memory; a short walk (batch 1 at
  // 256 keys) did no better without it, and keeps it ("Issue 19, round 16"). A row unit
  // prefetches: batch-32 decode attention 1.1x, batch 1 on one worker 1.15x ("round 15").
  const bool row_unit = !kv_unit && IsRowUnit(p, items, n_queries);
  const bool lone_ahead =
      n_queries == 1 && (p.kv_dtype != DType::kF32 || !IsLongWalk(n_chunks[0] - resume));
  const bool ahead = kv_unit || lone_ahead || row_unit;
  const int32_t ahead_chunks = kv_unit    ? KvUnitBatchChunks(n_queries)
                               : row_unit ? RowUnitAhead(n_queries)
                                          : kMaxChunkJobs;
  const int32_t batch_jobs = kv_unit ? ahead_chunks * n_queries : kMaxChunkJobs;
  int32_t n_jobs = 0;
  // Each job's partial merges into its own item's state, in job order (chunk order per item).
  // Runs of jobs with distinct items (one chunk of several prefill rows, or of a decode row's
  // query heads) are independent merges: AVX-512 and AVX2 run each such run as the lanes of one
  // register.
  const bool lanes = isa == Isa::kAvx512 || isa == Isa::kAvx2;
  auto flush = [&] {
    ChunkPartials(isa, p, jobs, n_jobs, parts);
    for (int32_t k = 0; k < n_jobs;) {
      const bool merges = sink || rel[k] > 0;  // else chunk 0 starts the state
      int32_t e = k + 1;
      while (lanes && merges && e < n_jobs && owner[e] > owner[e - 1] && (sink || rel[e] > 0)) {
        ++e;
      }
      if (e - k > 1) {
        AttentionPartial* targets[kMaxChunkJobs];
        for (int32_t j = k; j < e; ++j) targets[j - k] = &acc[owner[j]];
        MergePartials(isa, p.head_dim, e - k, targets, parts + k);
      } else if (merges) {
        MergePartial(isa, p.head_dim, &acc[owner[k]], parts[k]);
      } else {
        CopyPartial(p.head_dim, parts[k], &acc[owner[k]]);
      }
      k = e;
    }
    n_jobs = 0;
  };
  for (int32_t c = resume; c < max_chunks; ++c) {  // the jobs chunk-major, then query by query
    for (int32_t i = 0; i < n_queries; ++i) {
      if (c >= n_chunks[i]) continue;
      jobs[n_jobs] =
          ahead ? AheadJobOf(p, items[i], c, n_chunks[i], ahead_chunks) : JobOf(p, items[i], c);
      owner[n_jobs] = i;
      rel[n_jobs] = c;
      if (++n_jobs == batch_jobs) flush();
    }
  }
  if (n_jobs > 0) flush();
  for (int32_t i = 0; i < n_queries; ++i) {
    if (keep != nullptr) {
      CopyPartial(p.head_dim, acc[i], &keep[i]);
    } else {
      FinishPartial(isa, p.head_dim, acc[i], OutOf(p, items[i]));
    }
  }
}

// The chunks of a split item's first run (the rest are spread over the workers in runs as long):
// its n chunks cut into `workers` runs.
inline int32_t FirstRunChunks(int32_t n, int workers) {
  return std::max<int32_t>(1, (n + workers - 1) / workers);
}

}  // namespace

void Attention(Isa isa, const AttentionParams& p, AttentionKernel kernel, ThreadPool* pool,
               AttentionScratch* scratch) {
  const int64_t n_items = static_cast<int64_t>(p.n_tokens) * p.n_heads;
  if (n_items == 0) return;
  const int workers = pool != nullptr ? pool->size() : 1;
  AttentionScratch local;
  AttentionScratch* s = scratch != nullptr ? scratch : &local;

  // Prefill tiles: with AVX-512, a group of at least kMinTileQueries rows runs as tiles of up to
  // kTileRows rows, one query per lane (the same bits; a bf16 pool's K/V are widened span by
  // span; with a sliding window each lane walks only its window's chunks, from its own first
  // chunk, with or without sinks).
  const bool tiles = isa == Isa::kAvx512;
  const int32_t group_max = tiles ? internal::kTileRows : kGroupQueries;

  auto alone = [&](int32_t t) {
    return (t == 0 || p.block_tables[t - 1] != p.block_tables[t]) &&
           (t + 1 == p.n_tokens || p.block_tables[t + 1] != p.block_tables[t]);
  };
  // Sibling groups (full attention, attention_siblings.cc): decode rows alone in their sequence
  // whose tables start with the same blocks (GRPO samples of one prompt share its blocks) run
  // together, so a shared chunk is brought in once for all of them: with the tile, the query
  // heads of one kv head (they read the same K/V) of up to kTileRows / heads-per-kv-head rows per
  // task, else one head of up to kGroupQueries rows. Each row still walks its own block table and
  // its own chunks in order.
  const int32_t q_per_kv = p.n_heads / p.n_kv_heads;
  const bool sibling_tiles = tiles && q_per_kv <= internal::kTileRows;
  const int32_t sibling_heads = sibling_tiles ? q_per_kv : 1;
  const int32_t sibling_max = sibling_tiles ? internal::kTileRows / q_per_kv : kGroupQueries;
  std::vector<int32_t>& alone_rows = s->alone_rows;
  alone_rows.clear();
  if (p.window <= 0 && kernel != AttentionKernel::kSplit) {
    for (int32_t t = 0; t < p.n_tokens; ++t) {
      if (alone(t)) alone_rows.push_back(t);
    }
  }
  internal::PlanSiblingGroups(p, alone_rows, sibling_max, &s->siblings);
  const std::vector<int32_t>& sibling_rows = s->siblings.rows;
  const std::vector<int32_t>& sibling_begin = s->siblings.begin;
  std::vector<uint8_t>& in_sibling_group = s->in_sibling_group;
  in_sibling_group.assign(p.n_tokens, 0);
  for (int32_t g = 0; g + 1 < static_cast<int32_t>(sibling_begin.size()); ++g) {
    for (int32_t k = sibling_begin[g]; k < sibling_begin[g + 1]; ++k) {
      in_sibling_group[sibling_rows[k]] = 1;
    }
  }
  // A token alone in its sequence within the call (decode) and without siblings is "lone". With
  // grouped-query attention, a lone row's query heads that read one kv head are one unit of work
  // (a task, or split as one): each chunk of K/V is brought in once for all of them instead of
  // once per query head. kv_unit heads per task (a kv head's query heads cut evenly when there
  // are more than kGroupQueries).
  auto lone = [&](int32_t t) { return alone(t) && !in_sibling_group[t]; };
  const bool kv_units = q_per_kv > 1;
  const int32_t kv_tasks = (q_per_kv + kGroupQueries - 1) / kGroupQueries;
  const int32_t kv_unit = (q_per_kv + kv_tasks - 1) / kv_tasks;
  auto unit_heads = [&](int32_t t) { return kv_units && lone(t) ? q_per_kv : 1; };
  // The heads of the kv_unit run starting at query head h (0 where no run starts at h).
  auto kv_run = [&](int32_t h) {
    const int32_t in = h % q_per_kv;
    return in % kv_unit == 0 ? std::min(kv_unit, q_per_kv - in) : 0;
  };

  // Which items run split. kAuto: the units of the tail of the last wave, when there are idle
  // workers for them (all units, when there are fewer than workers).
  int64_t first_split = n_items;
  if (kernel == AttentionKernel::kSplit) {
    first_split = 0;
  } else if (kernel == AttentionKernel::kAuto && workers > 1) {
    int64_t units = 0;
    for (int32_t t = 0; t < p.n_tokens; ++t) units += p.n_heads / unit_heads(t);
    int64_t tail = units < workers ? units : units % workers;
    for (int32_t t = p.n_tokens - 1; t >= 0 && tail > 0; --t) {
      const int32_t per = unit_heads(t);
      const int64_t take = std::min<int64_t>(tail, p.n_heads / per);
      first_split = static_cast<int64_t>(t) * p.n_heads + p.n_heads - take * per;
      tail -= take;
    }
  }

  // Split items, in groups of the split_heads[k] items k, k + 1, ... whose chunks are computed
  // together: kv_unit for the first of a lone row's kv_unit heads of one kv head (0 for the
  // others), 1 for every other split item. The n chunks of a group's items are cut into runs of
  // FirstRunChunks(n, workers) chunks. The first is walked and merged as it goes by one worker,
  // which leaves each item's running state in split_states[k + i]; each later chunk's partials go
  // to the scratch, chunk-major: item k + i's partial of chunk c >= first is
  // partials[chunk_base[k] + (c - first) * split_heads[k] + i].
  std::vector<int64_t>& split_items = s->split_items;
  std::vector<int64_t>& chunk_base = s->chunk_base;
  std::vector<int32_t>& split_heads = s->split_heads;
  std::vector<int32_t>& split_groups = s->split_groups;  // k of each group's first item
  std::vector<uint8_t>& is_split = s->is_split;
  split_items.clear();
  chunk_base.clear();
  split_heads.clear();
  split_groups.clear();
  is_split.assign(n_items, 0);
  int64_t n_partials = 0;
  for (int64_t i = first_split; i < n_items; ++i) {
    const Item it = ItemOf(p, i);
    const int32_t n = NumChunks(p, it.row);
    if (n < 2 && kernel != AttentionKernel::kSplit) continue;
    const int32_t heads = unit_heads(it.row) == 1 ? 1 : kv_run(it.head);
    if (heads > 0) split_groups.push_back(static_cast<int32_t>(split_items.size()));
    split_items.push_back(i);
    chunk_base.push_back(n_partials);
    split_heads.push_back(heads);
    is_split[i] = 1;
    n_partials += heads * static_cast<int64_t>(n - FirstRunChunks(n, workers));
  }
  if (static_cast<int64_t>(s->partials.size()) < n_partials) s->partials.resize(n_partials);
  if (s->split_states.size() < split_items.size()) s->split_states.resize(split_items.size());

  // Phase 1 tasks, four int32 each, {kind, a, b, c}:
  //   kRowsTask {first token, tokens, head}: up to group_max consecutive tokens of one head and
  //     one sequence (same block table), none of them split;
  //   kHeadsTask {token, heads, first head}: consecutive heads of a decode row (below);
  //   kSiblingsTask {sibling group, 0, first head}: sibling_heads heads of a sibling group
  //     (above);
  //   kSplitTask {split index, first chunk, chunks}: one run of consecutive chunks of split
  //     item k's split_heads[k] heads (above).
  enum : int32_t { kRowsTask, kHeadsTask, kSiblingsTask, kSplitTask };
  std::vector<int32_t>& tasks = s->tasks;
  tasks.clear();
  for (int32_t g = 0; g + 1 < static_cast<int32_t>(sibling_begin.size()); ++g) {
    for (int32_t h = 0; h < p.n_heads; h += sibling_heads) {
      tasks.insert(tasks.end(), {kSiblingsTask, g, 0, h});
    }
  }
  // Lone rows' heads: with grouped-query attention, the kv_run heads of one kv head per task
  // (none of them split). Otherwise (one query head per kv head), when there are at least as many
  // lone rows as workers: runs of up to head_group consecutive heads (the heads cut evenly), none
  // of them split, whose chunks are computed together (a block's heads are adjacent in the pool);
  // head_group is at most kMaxHeadGroup when that still gives every worker kMinTasksPerWorker
  // tasks (always with one worker), else at most kGroupQueries. A row whose heads each make a
  // long walk (IsLongWalk) walks its heads one by one instead (below, as rows of one head): each
  // batch then holds one query, which takes one broadcast per step, and with fp32 K/V no
  // prefetch (RunSingle); batch-1 decode at 4K keys on one worker reads 1.14x the bandwidth share
  // of its heads in row units (docs/benchmarks.md, "Issue 19, round 16").
  auto grouped = [&](int32_t t) { return lone(t) && (kv_units || !IsLongWalk(NumChunks(p, t))); };
  int32_t n_lone = 0;
  for (int32_t t = 0; t < p.n_tokens; ++t) n_lone += lone(t) ? 1 : 0;
  const bool head_groups = kv_units || n_lone >= workers;
  const int32_t wide_groups = (p.n_heads + kMaxHeadGroup - 1) / kMaxHeadGroup;
  const bool wide =
      workers == 1 || int64_t{n_lone} * wide_groups >= int64_t{kMinTasksPerWorker} * workers;
  const int32_t n_head_groups =
      wide ? wide_groups : (p.n_heads + kGroupQueries - 1) / kGroupQueries;
  const int32_t head_group = (p.n_heads + n_head_groups - 1) / n_head_groups;
  for (int32_t t = 0; t < p.n_tokens && head_groups; ++t) {
    if (!grouped(t)) continue;
    const int64_t row = static_cast<int64_t>(t) * p.n_heads;
    for (int32_t h = 0; h < p.n_heads;) {
      if (is_split[row + h]) {
        ++h;
        continue;
      }
      int32_t n = kv_units ? kv_run(h) : 1;  // a kv unit is split or not as a whole
      while (!kv_units && n < head_group && h + n < p.n_heads && !is_split[row + h + n]) ++n;
      tasks.insert(tasks.end(), {kHeadsTask, t, n, h});
      h += n;
    }
  }
  for (int32_t h = 0; h < p.n_heads; ++h) {
    int32_t group_first = 0, group_n = 0;
    for (int32_t t = 0; t < p.n_tokens; ++t) {
      if (is_split[static_cast<int64_t>(t) * p.n_heads + h] || in_sibling_group[t] ||
          (head_groups && grouped(t))) {
        if (group_n > 0) tasks.insert(tasks.end(), {kRowsTask, group_first, group_n, h});
        group_n = 0;
        continue;
      }
      if (group_n > 0 && group_n < group_max && group_first + group_n == t &&
          p.block_tables[t] == p.block_tables[group_first]) {
        ++group_n;
        continue;
      }
      if (group_n > 0) tasks.insert(tasks.end(), {kRowsTask, group_first, group_n, h});
      group_first = t;
      group_n = 1;
    }
    if (group_n > 0) tasks.insert(tasks.end(), {kRowsTask, group_first, group_n, h});
  }
  for (const int32_t k : split_groups) {
    const int32_t n = NumChunks(p, ItemOf(p, split_items[k]).row);
    const int32_t per = FirstRunChunks(n, workers);
    for (int32_t c0 = 0; c0 < n; c0 += per) {
      tasks.insert(tasks.end(), {kSplitTask, static_cast<int32_t>(k), c0, std::min(per, n - c0)});
    }
  }

  // Phase 1: single-worker groups, and every chunk of every split item.
  const int64_t n_tasks = static_cast<int64_t>(tasks.size()) / 4;
  // A sibling task's items walk their shared leading chunks (same block ids, every key at or
  // before every row's position) in the prefill tile, then each item its own chunks from there.
  auto run_siblings = [&](const Item* items, int32_t n, int32_t shared) {
    if (!sibling_tiles || n < kMinTileQueries || shared == 0) {
      for (int32_t i = 0; i < n; i += kGroupQueries) {
        RunSingle(isa, p, items + i, std::min(kGroupQueries, n - i));
      }
      return;
    }
    AttentionPartial states[internal::kTileRows];
    internal::AttentionTileStatesAvx512(p, items, n, shared, states, p.test_fused_sibling_tile);
    for (int32_t i = 0; i < n; i += kGroupQueries) {
      RunSingle(isa, p, items + i, std::min(kGroupQueries, n - i), states + i, shared);
    }
  };
  auto phase1 = [&](int /*worker*/, int64_t task) {
    const int32_t* t = &tasks[4 * task];
    Item items[kMaxRunItems];
    switch (t[0]) {
      case kHeadsTask:  // heads t[3] .. t[3] + t[2] - 1 of token t[1]
        for (int32_t i = 0; i < t[2]; ++i) items[i] = {t[1], t[3] + i};
        RunSingle(isa, p, items, t[2]);
        return;
      case kSiblingsTask: {               // heads t[3] .. of sibling group t[1]'s rows
        Item group[internal::kTileRows];  // row by row, so a row's heads share its own chunks
        int32_t n = 0;
        for (int32_t k = sibling_begin[t[1]]; k < sibling_begin[t[1] + 1]; ++k) {
          const int32_t token = sibling_rows[k];
          for (int32_t h = t[3]; h < t[3] + sibling_heads; ++h) {
            if (!is_split[static_cast<int64_t>(token) * p.n_heads + h]) group[n++] = {token, h};
          }
        }
        if (n > 0) run_siblings(group, n, s->siblings.shared[t[1]]);
        return;
      }
      case kRowsTask:
        if (tiles && t[2] >= kMinTileQueries) {
          internal::AttentionTileAvx512(p, t[1], t[2], t[3]);
          return;
        }
        // <= kGroupQueries rows: no tile, or a short group
        for (int32_t i = 0; i < t[2]; ++i) items[i] = {t[1] + i, t[3]};
        RunSingle(isa, p, items, t[2]);
        return;
      default: {  // kSplitTask: chunks t[2] .. t[2] + t[3] - 1 of split group k
        const int64_t k = t[1];
        const int32_t heads = split_heads[k];
        for (int32_t i = 0; i < heads; ++i) items[i] = ItemOf(p, split_items[k + i]);
        if (t[2] == 0) {  // the first run: walked as a single-worker item, its states kept
          RunSingle(isa, p, items, heads, nullptr, 0, &s->split_states[k], t[3]);
          return;
        }
        // A later run: every chunk's partials, chunk-major (in place in the scratch), batched as
        // RunSingle batches the same items, each batch prefetching the next within the run.
        const int32_t first = FirstRunChunks(NumChunks(p, items[0].row), workers);
        AttentionPartial* out =
            &s->partials[chunk_base[k] + static_cast<int64_t>(t[2] - first) * heads];
        const int32_t batch_chunks = heads > 1 ? KvUnitBatchChunks(heads) : kMaxChunkJobs;
        const int32_t end = t[2] + t[3];
        ChunkJob jobs[kMaxChunkJobs];
        for (int32_t c0 = t[2]; c0 < end; c0 += batch_chunks) {
          int32_t n_jobs = 0;
          for (int32_t c = c0; c < std::min(end, c0 + batch_chunks); ++c) {
            for (int32_t i = 0; i < heads; ++i) {
              jobs[n_jobs++] = AheadJobOf(p, items[i], c, end, batch_chunks);
            }
          }
          ChunkPartials(isa, p, jobs, n_jobs, out);
          out += n_jobs;
        }
        return;
      }
    }
  };
  // Phase 2: one worker per split group merges its later chunks' partials into the first run's
  // states, left to right (a kv unit's heads as the lanes of one register), then writes them.
  auto phase2 = [&](int /*worker*/, int64_t r) {
    const int32_t k = split_groups[r];
    const int32_t heads = split_heads[k];
    const int32_t n = NumChunks(p, ItemOf(p, split_items[k]).row);
    const int32_t first = FirstRunChunks(n, workers);
    AttentionPartial* acc = &s->split_states[k];
    const AttentionPartial* parts = &s->partials[chunk_base[k]];
    AttentionPartial* targets[kGroupQueries];
    for (int32_t i = 0; i < heads; ++i) targets[i] = &acc[i];
    for (int32_t c = first; c < n; ++c, parts += heads) {
      MergePartials(isa, p.head_dim, heads, targets, parts);
    }
    for (int32_t i = 0; i < heads; ++i) {
      FinishPartial(isa, p.head_dim, acc[i], OutOf(p, ItemOf(p, split_items[k + i])));
    }
  };
  const int64_t n_split = static_cast<int64_t>(split_groups.size());
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
    const int32_t pos = p.positions[it.row];
    const float* q = QueryOf(p, it);
    const int32_t kvh = KvHeadOf(p, it.head);
    const int32_t lo = WindowLo(p, it.row), c0 = lo / kAttentionChunk;
    AttentionPartial acc;
    AttentionPartial part;
    if (p.sinks != nullptr) SinkPartial(p, it.head, &acc);
    for (int32_t c = c0; c <= pos / kAttentionChunk; ++c) {
      AttentionPartial* dst = c == c0 && p.sinks == nullptr ? &acc : &part;
      internal::ChunkPartialWindowScalar(p, q, kvh, p.block_tables[it.row], pos, lo, c, dst);
      if (dst == &part) MergePartial(Isa::kScalar, p.head_dim, &acc, part);
    }
    FinishPartial(Isa::kScalar, p.head_dim, acc, OutOf(p, it));
  }
}

}  // namespace bitroll::kernels
