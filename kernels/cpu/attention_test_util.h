// The attention tests' shared fixture: a KV pool of random values, block tables that scatter each
// row's sequence over it, and the memcmp helpers. Header-only, for the kernels' test binaries.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/thread_pool.h"

namespace bitroll::kernels::attention_test {

struct Case {
  int32_t n_heads, n_kv_heads, head_dim, block_size;
  std::vector<int32_t> positions;  // one query row per entry, each its own sequence
};

// A KV pool filled with random values, block tables that scatter each sequence's blocks.
struct Fixture {
  Case c;
  std::vector<float> q, k, v;
  std::vector<std::vector<int32_t>> tables;
  std::vector<const int32_t*> table_ptrs;
  AttentionParams p;

  explicit Fixture(const Case& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int32_t n = static_cast<int32_t>(c.positions.size());
    int32_t total_blocks = 0;
    for (int32_t pos : c.positions) total_blocks += pos / c.block_size + 1;
    std::vector<int32_t> ids(total_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int32_t next = 0;
    for (int32_t pos : c.positions) {
      std::vector<int32_t> t;
      for (int32_t b = 0; b <= pos / c.block_size; ++b) t.push_back(ids[next++]);
      tables.push_back(t);
    }
    for (auto& t : tables) table_ptrs.push_back(t.data());
    const int64_t pool = int64_t{total_blocks} * c.n_kv_heads * c.head_dim * c.block_size;
    k.resize(pool);
    v.resize(pool);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    q.resize(int64_t{n} * c.n_heads * c.head_dim);
    for (float& x : q) x = nd(rng) * 2.0f;
    p.n_tokens = n;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv_heads;
    p.head_dim = c.head_dim;
    p.block_size = c.block_size;
    p.q = q.data();
    p.k_cache = k.data();
    p.v_cache = v.data();
    p.positions = c.positions.data();
    p.block_tables = table_ptrs.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  }

  // Switches the pools to a bf16 cache: k16/v16 hold k/v rounded to bf16 (nearest even), and k/v
  // are replaced by those rounded values widened back to fp32 (so Naive() sees what is stored).
  // Returns the fp32 parameters over the widened pools, for comparison.
  AttentionParams UseBf16Kv() {
    k16.resize(k.size());
    v16.resize(v.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k16[i] = F32ToBf16(k[i]);
      k[i] = Bf16ToF32(k16[i]);
      v16[i] = F32ToBf16(v[i]);
      v[i] = Bf16ToF32(v16[i]);
    }
    AttentionParams widened = p;
    p.k_cache = k16.data();
    p.v_cache = v16.data();
    p.kv_dtype = DType::kBF16;
    return widened;
  }
  std::vector<uint16_t> k16, v16;

  std::vector<float> Run(Isa isa, AttentionKernel kernel, ThreadPool* pool) {
    std::vector<float> out(q.size(), -1.0f);
    AttentionParams pp = p;
    pp.out = out.data();
    AttentionScratch scratch;
    Attention(isa, pp, kernel, pool, &scratch);
    return out;
  }
  std::vector<float> Reference() {
    std::vector<float> out(q.size(), -1.0f);
    AttentionParams pp = p;
    pp.out = out.data();
    AttentionReference(pp);
    return out;
  }
  // Naive attention in double precision: the truth for the accuracy check.
  std::vector<double> Naive() {
    std::vector<double> out(q.size());
    for (size_t t = 0; t < c.positions.size(); ++t) {
      for (int32_t h = 0; h < c.n_heads; ++h) {
        const int32_t kvh = h / (c.n_heads / c.n_kv_heads);
        const float* qv = q.data() + (t * c.n_heads + h) * c.head_dim;
        std::vector<double> s(c.positions[t] + 1);
        for (int32_t j = 0; j <= c.positions[t]; ++j) {
          const int64_t blk = tables[t][j / c.block_size], slot = j % c.block_size;
          const float* kb = k.data() + (blk * c.n_kv_heads + kvh) * c.head_dim * c.block_size;
          double acc = 0;
          for (int32_t d = 0; d < c.head_dim; ++d)
            acc += double(qv[d]) * kb[d * c.block_size + slot];
          s[j] = acc / std::sqrt(double(c.head_dim));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - m));
        for (int32_t d = 0; d < c.head_dim; ++d) {
          double acc = 0;
          for (int32_t j = 0; j <= c.positions[t]; ++j) {
            const int64_t blk = tables[t][j / c.block_size], slot = j % c.block_size;
            const float* vb = v.data() + (blk * c.n_kv_heads + kvh) * c.head_dim * c.block_size;
            acc += s[j] * vb[slot * c.head_dim + d];
          }
          out[(t * c.n_heads + h) * c.head_dim + d] = acc / l;
        }
      }
    }
    return out;
  }
};

inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) {
      isas.push_back(isa);
    } else {
      std::cerr << "*** attention_test: this CPU lacks " << IsaName(isa)
                << "; that path is NOT tested here ***\n";
    }
  }
  return isas;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every supported ISA, each thread count of `threads` and each kernel of `kernels`: f.Run()
// gives the bits of `ref` (memcmp). `what` names the case in a failure.
inline void ExpectReferenceBits(Fixture& f, const std::vector<float>& ref,
                                std::initializer_list<int> threads, const std::string& what,
                                std::initializer_list<AttentionKernel> kernels = {
                                    AttentionKernel::kSingle, AttentionKernel::kSplit,
                                    AttentionKernel::kAuto}) {
  for (Isa isa : SupportedIsas()) {
    for (int t : threads) {
      ThreadPool pool(t);
      for (AttentionKernel k : kernels) {
        EXPECT_TRUE(SameBits(ref, f.Run(isa, k, &pool)))
            << what << ": isa " << IsaName(isa) << " threads " << t << " kernel "
            << AttentionKernelName(k);
      }
    }
  }
}

// Random sink logits, one per query head.
inline std::vector<float> Sinks(int32_t n_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> s(n_heads);
  for (float& x : s) x = nd(rng);
  return s;
}

}  // namespace bitroll::kernels::attention_test
