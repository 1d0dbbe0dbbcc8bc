// GPU tests of the dual-kernel attention: kernel 1 vs kernel 2 (and kAuto) by memcmp over batch
// 1..64 and contexts 1..2000, batch-composition invariance, prefill (chunked any way) == decode
// bitwise, agreement with the CPU reference, and the flash-decoding negative control. Each test
// skips loudly without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/test_util.h"

namespace bitroll::kernels::cuda {
namespace {

using testing::DeviceBuffer;

struct Config {
  int32_t n_heads, n_kv_heads, head_dim;
};

constexpr int32_t kBlockSize = 32;
constexpr int32_t kMaxContext = 2048;
constexpr int32_t kStride = kMaxContext / kBlockSize;
constexpr int32_t kNumBlocks = 160;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A random paged KV cache (engine layout) on host and device.
struct Cache {
  explicit Cache(const Config& c)
      : cfg(c),
        k(Random(static_cast<size_t>(kNumBlocks) * c.n_kv_heads * c.head_dim * kBlockSize, 100)),
        v(Random(k.size(), 101)),
        kd(k),
        vd(v) {}
  Config cfg;
  std::vector<float> k, v;
  DeviceBuffer<float> kd, vd;
};

// One query row: its q [n_heads][head_dim], position and block table.
struct Query {
  std::vector<float> q;
  int32_t position;
  std::vector<int32_t> table;  // kStride entries
};

std::vector<int32_t> RandomTable(std::mt19937& rng) {
  std::vector<int32_t> t(kStride);
  for (auto& b : t) b = static_cast<int32_t>(rng() % kNumBlocks);
  return t;
}

Query RandomQuery(const Config& c, int32_t position, std::vector<int32_t> table, uint32_t seed) {
  return {Random(static_cast<size_t>(c.n_heads) * c.head_dim, seed), position, std::move(table)};
}

enum class Mode { kSingle, kSplit, kAuto, kFlash };

// Runs one call over `qs` and returns out [n][n_heads][head_dim].
std::vector<float> RunAttention(const Cache& cache, const std::vector<Query>& qs, Mode run,
                                int32_t num_sms = 132) {
  const Config& c = cache.cfg;
  const size_t per = static_cast<size_t>(c.n_heads) * c.head_dim;
  std::vector<float> q(qs.size() * per);
  std::vector<int32_t> pos(qs.size()), tables(qs.size() * kStride);
  for (size_t i = 0; i < qs.size(); ++i) {
    std::copy(qs[i].q.begin(), qs[i].q.end(), q.begin() + i * per);
    pos[i] = qs[i].position;
    std::copy(qs[i].table.begin(), qs[i].table.end(), tables.begin() + i * kStride);
  }
  DeviceBuffer<float> qd(q), out(q.size());
  DeviceBuffer<int32_t> pd(pos), td(tables);
  out.Fill(0xFF);
  CudaAttentionParams p;
  p.n_tokens = static_cast<int32_t>(qs.size());
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.block_size = kBlockSize;
  p.q = qd.get();
  p.out = out.get();
  p.k_cache = cache.kd.get();
  p.v_cache = cache.vd.get();
  p.positions = pd.get();
  p.block_tables = td.get();
  p.block_table_stride = kStride;
  p.max_context = kMaxContext;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cudaError_t err;
  if (run == Mode::kFlash) {
    DeviceBuffer<char> ws(CudaFlashDecodeWorkspaceBytes(p, num_sms));
    err = CudaFlashDecodeAttention(p, num_sms, ws.get(), ws.size(), nullptr);
  } else {
    const CudaAttentionKernel kernel = run == Mode::kSingle  ? CudaAttentionKernel::kSingle
                                       : run == Mode::kSplit ? CudaAttentionKernel::kSplit
                                                             : CudaAttentionKernel::kAuto;
    DeviceBuffer<char> ws(CudaAttentionWorkspaceBytes(p, kernel));
    err = CudaAttention(p, kernel, ws.get(), ws.size(), nullptr);
  }
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
  std::vector<float> h = out.Download();
  for (float x : h) {
    if (!std::isfinite(x)) {
      ADD_FAILURE() << "non-finite or unwritten attention output";
      break;
    }
  }
  return h;
}

const Config kConfigs[] = {{4, 4, 64}, {8, 2, 128}, {14, 2, 64}, {8, 1, 256}, {6, 3, 40}};

// Contexts 1..2000: the edges of chunks and blocks, plus random lengths.
std::vector<int32_t> Contexts(size_t n, uint32_t seed) {
  std::vector<int32_t> ctx = {1, 2, 15, 16, 17, 31, 32, 33, 2000, 1999, 48, 257};
  std::mt19937 rng(seed);
  while (ctx.size() < n) ctx.push_back(1 + static_cast<int32_t>(rng() % 2000));
  ctx.resize(n);
  return ctx;
}

TEST(CudaAttentionTest, Kernel1EqualsKernel2Bitwise) {
  BR_REQUIRE_CUDA_DEVICE();
  for (const Config& c : kConfigs) {
    Cache cache(c);
    std::mt19937 rng(7);
    const auto ctx = Contexts(64, 8);
    std::vector<Query> pool;
    for (size_t i = 0; i < ctx.size(); ++i) {
      pool.push_back(RandomQuery(c, ctx[i] - 1, RandomTable(rng), 1000 + i));
    }
    for (size_t batch : {1, 2, 3, 5, 8, 13, 21, 34, 55, 64}) {
      const std::vector<Query> qs(pool.begin(), pool.begin() + batch);
      const auto single = RunAttention(cache, qs, Mode::kSingle);
      const auto split = RunAttention(cache, qs, Mode::kSplit);
      const auto autok = RunAttention(cache, qs, Mode::kAuto);
      ASSERT_EQ(std::memcmp(single.data(), split.data(), single.size() * sizeof(float)), 0)
          << "kernel 1 != kernel 2: heads " << c.n_heads << "/" << c.n_kv_heads << " dim "
          << c.head_dim << " batch " << batch;
      ASSERT_EQ(std::memcmp(single.data(), autok.data(), single.size() * sizeof(float)), 0)
          << "kernel 1 != auto, batch " << batch;
    }
  }
}

TEST(CudaAttentionTest, BatchCompositionInvariance) {
  BR_REQUIRE_CUDA_DEVICE();
  // 96 sequences x 8 kv heads = 768 items: more than one wave of resident CTAs on an H200, so
  // kAuto runs whole waves in kernel 1 and the tail in kernel 2.
  const Config c{32, 8, 128};
  Cache cache(c);
  std::mt19937 rng(17);
  std::vector<Query> pool;
  for (int i = 0; i < 96; ++i) {
    pool.push_back(RandomQuery(c, static_cast<int32_t>(rng() % 600), RandomTable(rng), 2000 + i));
  }
  const size_t per = static_cast<size_t>(c.n_heads) * c.head_dim;
  std::printf("resident slots %lld, items %d\n", static_cast<long long>(CudaAttentionSlots()),
              96 * c.n_kv_heads);
  std::vector<std::vector<float>> alone;
  for (const Query& q : pool) alone.push_back(RunAttention(cache, {q}, Mode::kAuto));
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<size_t> idx(pool.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    const size_t n = trial == 0 ? pool.size() : 1 + rng() % pool.size();
    std::vector<Query> qs;
    for (size_t i = 0; i < n; ++i) qs.push_back(pool[idx[i]]);
    const auto out = RunAttention(cache, qs, Mode::kAuto);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(out.data() + i * per, alone[idx[i]].data(), per * sizeof(float)), 0)
          << "sequence " << idx[i] << " at slot " << i << " of a batch of " << n;
    }
  }
}

TEST(CudaAttentionTest, PrefillEqualsDecodeBitwise) {
  BR_REQUIRE_CUDA_DEVICE();
  for (const Config& c : {Config{8, 2, 128}, Config{14, 2, 64}}) {
    Cache cache(c);
    std::mt19937 rng(23);
    const auto table = RandomTable(rng);
    const int32_t T = 300;
    std::vector<Query> tokens;
    for (int32_t t = 0; t < T; ++t) tokens.push_back(RandomQuery(c, t, table, 3000 + t));
    const size_t per = static_cast<size_t>(c.n_heads) * c.head_dim;
    // Decode: one token per call (position t sees keys 0..t; the cache holds them all already).
    std::vector<float> decode;
    for (int32_t t = 0; t < T; ++t) {
      const auto o = RunAttention(cache, {tokens[t]}, Mode::kAuto);
      decode.insert(decode.end(), o.begin(), o.end());
    }
    // Prefill, chunked in several sizes, with every kernel choice.
    for (int32_t chunk : {16, 64, 100, 300}) {
      for (Mode run : {Mode::kAuto, Mode::kSingle, Mode::kSplit}) {
        std::vector<float> prefill;
        for (int32_t t0 = 0; t0 < T; t0 += chunk) {
          const std::vector<Query> part(tokens.begin() + t0,
                                        tokens.begin() + std::min(T, t0 + chunk));
          const auto o = RunAttention(cache, part, run);
          prefill.insert(prefill.end(), o.begin(), o.end());
        }
        ASSERT_EQ(prefill.size(), T * per);
        ASSERT_EQ(std::memcmp(prefill.data(), decode.data(), decode.size() * sizeof(float)), 0)
            << "prefill chunk " << chunk << " != decode (dim " << c.head_dim << ")";
      }
    }
  }
}

TEST(CudaAttentionTest, AgreesWithCpuReference) {
  BR_REQUIRE_CUDA_DEVICE();
  for (const Config& c : kConfigs) {
    Cache cache(c);
    std::mt19937 rng(29);
    const auto ctx = Contexts(24, 30);
    std::vector<Query> qs;
    for (size_t i = 0; i < ctx.size(); ++i) {
      qs.push_back(RandomQuery(c, ctx[i] - 1, RandomTable(rng), 4000 + i));
    }
    const auto gpu = RunAttention(cache, qs, Mode::kAuto);
    const size_t per = static_cast<size_t>(c.n_heads) * c.head_dim;
    std::vector<float> q(qs.size() * per), cpu(qs.size() * per);
    std::vector<int32_t> pos(qs.size());
    std::vector<const int32_t*> tables(qs.size());
    for (size_t i = 0; i < qs.size(); ++i) {
      std::copy(qs[i].q.begin(), qs[i].q.end(), q.begin() + i * per);
      pos[i] = qs[i].position;
      tables[i] = qs[i].table.data();
    }
    AttentionParams p;
    p.n_tokens = static_cast<int32_t>(qs.size());
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv_heads;
    p.head_dim = c.head_dim;
    p.block_size = kBlockSize;
    p.q = q.data();
    p.out = cpu.data();
    p.k_cache = cache.k.data();
    p.v_cache = cache.v.data();
    p.positions = pos.data();
    p.block_tables = tables.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    AttentionReference(p);
    for (size_t i = 0; i < cpu.size(); ++i) {
      ASSERT_NEAR(gpu[i], cpu[i], 2e-5f) << "element " << i << " heads " << c.n_heads << "/"
                                         << c.n_kv_heads << " dim " << c.head_dim;
    }
  }
}

// NEGATIVE CONTROL: flash-decoding picks its split count from the batch, so a sequence's output
// changes with the batch around it, and memcmp must catch it.
TEST(CudaAttentionTest, NegativeControlFlashDecodingBreaksInvariance) {
  BR_REQUIRE_CUDA_DEVICE();
  const Config c{8, 2, 128};
  Cache cache(c);
  std::mt19937 rng(31);
  std::vector<Query> pool;
  for (int i = 0; i < 64; ++i) {
    pool.push_back(RandomQuery(c, i == 0 ? 1999 : 1000 + static_cast<int32_t>(rng() % 999),
                               RandomTable(rng), 5000 + i));
  }
  const size_t per = static_cast<size_t>(c.n_heads) * c.head_dim;
  const auto alone = RunAttention(cache, {pool[0]}, Mode::kFlash);
  const auto batch = RunAttention(cache, pool, Mode::kFlash);
  std::printf("flash-decoding splits: %d alone, %d in the batch of 64\n",
              CudaFlashDecodeSplits(c.n_kv_heads, 132, kMaxContext / 16),
              CudaFlashDecodeSplits(64 * c.n_kv_heads, 132, kMaxContext / 16));
  EXPECT_NE(std::memcmp(alone.data(), batch.data(), per * sizeof(float)), 0)
      << "negative control: flash-decoding's batch-dependent split was not caught by memcmp";
  // ... while the dual kernel gives the same bits either way.
  const auto dual_alone = RunAttention(cache, {pool[0]}, Mode::kAuto);
  const auto dual_batch = RunAttention(cache, pool, Mode::kAuto);
  EXPECT_EQ(std::memcmp(dual_alone.data(), dual_batch.data(), per * sizeof(float)), 0);
  for (size_t i = 0; i < per; ++i) EXPECT_NEAR(batch[i], dual_alone[i], 2e-5f);
}

}  // namespace
}  // namespace bitroll::kernels::cuda
