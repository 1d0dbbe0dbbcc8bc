// engine/moe.h: routing (fp32 softmax, top-k, ties to the lowest expert id, norm_topk_prob), the
// slot-order combine against a plain reference, and batch invariance of a row's output and
// routes with memcmp, with a token-count-dependent expert matmul as the negative control.
#include "engine/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/invariance_break.h"
#include "kernels/cpu/isa.h"

namespace bitroll::engine {
namespace {

constexpr int32_t kDim = 24, kHidden = 20, kExperts = 6, kTopK = 2, kShared = 12;

// A one-layer MoE model in memory; the vectors own the floats the Tensors point to.
struct Model {
  std::vector<std::vector<float>> store;
  ModelWeights w;

  Tensor Make(std::vector<int64_t> shape, std::mt19937* rng, float scale) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::normal_distribution<float> nd(0.0f, scale);
    store.emplace_back(size_t(n));
    for (float& v : store.back()) v = nd(*rng);
    Tensor t;
    t.data = store.back().data();
    t.shape = std::move(shape);
    return t;
  }
};

std::unique_ptr<Model> MakeModel(bool shared, bool norm_topk, uint32_t seed) {
  auto m = std::make_unique<Model>();
  m->store.reserve(64);
  std::mt19937 rng(seed);
  ModelConfig& c = m->w.config;
  c.dim = kDim;
  c.hidden_dim = kHidden;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 16;
  c.max_seq_len = 16;
  c.n_experts = kExperts;
  c.n_experts_per_tok = kTopK;
  c.moe_hidden_dim = kHidden;
  c.norm_topk_prob = norm_topk;
  c.shared_expert_hidden = shared ? kShared : 0;
  LayerWeights L;
  L.router = m->Make({kExperts, kDim}, &rng, 0.5f);
  for (int e = 0; e < kExperts; ++e) {
    FfnWeights f;
    f.w1 = m->Make({kHidden, kDim}, &rng, 0.3f);
    f.w2 = m->Make({kDim, kHidden}, &rng, 0.3f);
    f.w3 = m->Make({kHidden, kDim}, &rng, 0.3f);
    L.experts.push_back(f);
  }
  if (shared) {
    L.shared_expert.w1 = m->Make({kShared, kDim}, &rng, 0.3f);
    L.shared_expert.w2 = m->Make({kDim, kShared}, &rng, 0.3f);
    L.shared_expert.w3 = m->Make({kShared, kDim}, &rng, 0.3f);
    L.shared_expert_gate = m->Make({1, kDim}, &rng, 0.3f);
  }
  m->w.layers.push_back(L);
  return m;
}

std::vector<float> Inputs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n * kDim));
  for (float& v : x) v = nd(rng);
  return x;
}

struct Out {
  std::vector<float> y;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Out RunMoe(MoeFfn& moe, const MoeRunOptions& o, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size()) / kDim;
  Out r;
  r.y.resize(x.size());
  r.ids.resize(size_t(n * kTopK));
  r.weights.resize(size_t(n * kTopK));
  moe.Forward(o, 0, x.data(), n, r.y.data(), r.ids.data(), r.weights.data());
  return r;
}

double Dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

// The FFN of one expert in double.
std::vector<double> Ffn(const FfnWeights& f, int64_t hidden, const float* x) {
  std::vector<double> a(static_cast<size_t>(hidden)), y(kDim);
  for (int64_t h = 0; h < hidden; ++h) {
    const double g = Dot(static_cast<const float*>(f.w1.data) + h * kDim, x, kDim);
    const double u = Dot(static_cast<const float*>(f.w3.data) + h * kDim, x, kDim);
    a[size_t(h)] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int i = 0; i < kDim; ++i) {
    const float* w2 = static_cast<const float*>(f.w2.data) + i * hidden;
    for (int64_t h = 0; h < hidden; ++h) y[size_t(i)] += double(w2[h]) * a[size_t(h)];
  }
  return y;
}

TEST(Moe, MatchesAPlainReferenceAndRoutesByProbability) {
  for (bool shared : {false, true}) {
    for (bool norm : {false, true}) {
      auto m = MakeModel(shared, norm, 3);
      auto moe = MoeFfn::Create(m->w, kernels::DType::kF32);
      ASSERT_TRUE(moe.ok()) << moe.status().ToString();
      const std::vector<float> x = Inputs(9, 4);
      const Out out = RunMoe(**moe, {}, x);
      const LayerWeights& L = m->w.layers[0];
      for (int64_t r = 0; r < 9; ++r) {
        const float* xr = x.data() + r * kDim;
        std::vector<double> p(kExperts);
        double mx = -1e30, s = 0;
        for (int e = 0; e < kExperts; ++e) {
          p[size_t(e)] = Dot(static_cast<const float*>(L.router.data) + e * kDim, xr, kDim);
          mx = std::max(mx, p[size_t(e)]);
        }
        for (double& v : p) s += (v = std::exp(v - mx));
        for (double& v : p) v /= s;
        std::vector<int> order(kExperts);
        for (int e = 0; e < kExperts; ++e) order[size_t(e)] = e;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
        double wsum = 0;
        for (int j = 0; j < kTopK; ++j) wsum += p[size_t(order[size_t(j)])];
        std::vector<double> ref(kDim);
        for (int j = 0; j < kTopK; ++j) {
          const int e = order[size_t(j)];
          ASSERT_EQ(out.ids[size_t(r * kTopK + j)], e) << "row " << r << " slot " << j;
          const double wj = norm ? p[size_t(e)] / wsum : p[size_t(e)];
          EXPECT_NEAR(out.weights[size_t(r * kTopK + j)], wj, 1e-6);
          const std::vector<double> y = Ffn(L.experts[size_t(e)], kHidden, xr);
          for (int i = 0; i < kDim; ++i) ref[size_t(i)] += wj * y[size_t(i)];
        }
        if (shared) {
          const double g = Dot(static_cast<const float*>(L.shared_expert_gate.data), xr, kDim);
          const std::vector<double> y = Ffn(L.shared_expert, kShared, xr);
          for (int i = 0; i < kDim; ++i) ref[size_t(i)] += y[size_t(i)] / (1.0 + std::exp(-g));
        }
        for (int i = 0; i < kDim; ++i) {
          EXPECT_NEAR(out.y[size_t(r * kDim + i)], ref[size_t(i)], 1e-4) << r << "," << i;
        }
      }
    }
  }
}

TEST(Moe, TiesGoToTheLowestExpertId) {
  auto m = MakeModel(false, true, 5);
  // Experts 1, 3 and 4 get the same router row: equal logits, equal probabilities.
  float* router = const_cast<float*>(static_cast<const float*>(m->w.layers[0].router.data));
  for (int e : {3, 4}) std::memcpy(router + e * kDim, router + 1 * kDim, kDim * sizeof(float));
  // An input where that row wins: x = the row itself.
  std::vector<float> x(router + kDim, router + 2 * kDim);
  auto moe = MoeFfn::Create(m->w, kernels::DType::kF32);
  ASSERT_TRUE(moe.ok());
  const Out out = RunMoe(**moe, {}, x);
  EXPECT_EQ(out.ids[0], 1);
  EXPECT_EQ(out.ids[1], 3);
  EXPECT_EQ(std::memcmp(&out.weights[0], &out.weights[1], 4), 0);
}

// A row's output and routes do not depend on the rows beside it (memcmp), on every ISA and
// thread count; with the expert matmul split by token count they do (negative control).
TEST(Moe, RowOutputIsBatchInvariantAndTheBrokenExpertIsCaught) {
  auto m = MakeModel(true, true, 8);
  auto moe = MoeFfn::Create(m->w, kernels::DType::kF32);
  ASSERT_TRUE(moe.ok());
  const std::vector<float> batch = Inputs(37, 9);
  auto mismatches = [&](const MoeRunOptions& o) {
    const Out all = RunMoe(**moe, o, batch);
    int bad = 0;
    for (int64_t r = 0; r < 37; ++r) {
      const std::vector<float> one(batch.begin() + r * kDim, batch.begin() + (r + 1) * kDim);
      MoeRunOptions solo = o;
      const Out alone = RunMoe(**moe, solo, one);
      const bool same =
          std::memcmp(alone.y.data(), all.y.data() + r * kDim, kDim * 4) == 0 &&
          std::memcmp(alone.ids.data(), all.ids.data() + r * kTopK, kTopK * 4) == 0 &&
          std::memcmp(alone.weights.data(), all.weights.data() + r * kTopK, kTopK * 4) == 0;
      bad += same ? 0 : 1;
    }
    return bad;
  };
  kernels::ThreadPool pool(3);
  const Out ref = RunMoe(**moe, {}, batch);
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    Result<kernels::Isa> isa = kernels::ParseIsa(name);
    if (!isa.ok()) continue;
    for (kernels::ThreadPool* p : {static_cast<kernels::ThreadPool*>(nullptr), &pool}) {
      MoeRunOptions o;
      o.isa = *isa;
      o.pool = p;
      EXPECT_EQ(mismatches(o), 0) << name;
      const Out out = RunMoe(**moe, o, batch);
      EXPECT_EQ(std::memcmp(out.y.data(), ref.y.data(), ref.y.size() * 4), 0) << name;
    }
  }
  MoeRunOptions broken;
  broken.expert_matmul = &BatchVariantMatmul;
  EXPECT_GT(mismatches(broken), 0) << "a token-count-dependent expert matmul went unnoticed";
}

TEST(Moe, MissingOrMisshapedExpertIsATypedError) {
  auto m = MakeModel(false, true, 1);
  m->w.layers[0].experts[4].w2.data = nullptr;
  auto e = MoeFfn::Create(m->w, kernels::DType::kF32);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("expert 4"), std::string::npos) << e.status().ToString();
  auto m2 = MakeModel(false, true, 1);
  m2->w.layers[0].router.shape = {kExperts - 1, kDim};
  EXPECT_EQ(MoeFfn::Create(m2->w, kernels::DType::kF32).status().code(),
            ErrorCode::kInvalidArgument);
  auto m3 = MakeModel(false, true, 1);
  m3->w.layers[0].experts.pop_back();
  EXPECT_EQ(MoeFfn::Create(m3->w, kernels::DType::kF32).status().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace bitroll::engine
