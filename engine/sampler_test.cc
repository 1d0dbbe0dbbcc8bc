// Tests for the fixed-order sampler: filter sets, Gumbel-max, logprobs, determinism.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/philox.h"

namespace bitroll::engine {
namespace {

using kernels::Isa;

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (kernels::IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

SamplingParams Params(float t, int32_t k = 0, float top_p = 1.0f, float min_p = 0.0f,
                      uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

// Logits whose softmax is `probs` (up to a constant).
std::vector<float> LogitsFor(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(float(std::log(p)));
  return out;
}

// Independent reference for steps 1-5: full sorts, no candidate cutoffs, written from the
// documented definition.
std::vector<int32_t> ReferenceKept(const std::vector<float>& logits, const SamplingParams& p) {
  const int32_t n = int32_t(logits.size());
  if (p.temperature == 0.0f) {
    return {int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin())};
  }
  std::vector<float> scaled(logits.size());
  for (int32_t i = 0; i < n; ++i) scaled[i] = logits[i] / p.temperature;
  std::vector<int32_t> order(logits.size());
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scaled[a] > scaled[b]; });
  if (p.top_k > 0 && p.top_k < n) order.resize(size_t(p.top_k));
  std::sort(order.begin(), order.end());  // K ascending
  std::vector<float> vals;
  for (int32_t id : order) vals.push_back(scaled[id]);
  const int32_t kn = int32_t(vals.size());
  float m = vals[0];
  for (float v : vals) m = std::max(m, v);
  const float z = kernels::SumExpShifted(Isa::kScalar, vals.data(), kn, m);
  std::vector<std::pair<float, int32_t>> probs;
  for (int32_t j = 0; j < kn; ++j) probs.emplace_back(kernels::Exp(vals[j] - m) / z, order[j]);
  std::sort(probs.begin(), probs.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t len = probs.size();
  if (p.top_p < 1.0f) {
    float cum = 0.0f;
    for (size_t i = 0; i < probs.size(); ++i) {
      cum += probs[i].first;
      if (cum >= p.top_p) {
        len = i + 1;
        break;
      }
    }
  }
  std::vector<int32_t> kept;
  const float thr = p.min_p * probs[0].first;
  for (size_t i = 0; i < len; ++i) {
    if (p.min_p > 0.0f && probs[i].first < thr) continue;
    kept.push_back(probs[i].second);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(SamplerTest, GreedyTiesGoToLowestId) {
  Sampler s(kernels::BestIsa());
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f};
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    for (int64_t pos : {1, 7, 1000}) {
      SampleResult r = s.Sample(logits.data(), 5, Params(0.0f, 0, 1.0f, 0.0f, seed), 3, pos);
      EXPECT_EQ(r.token, 1);
    }
  }
  // Greedy scores at T = 1: kernels::LogSoftmax of the raw logits.
  std::vector<float> lsm(5);
  kernels::LogSoftmax(Isa::kScalar, logits.data(), 5, lsm.data());
  SampleResult r = s.Sample(logits.data(), 5, Params(0.0f), 0, 1);
  EXPECT_EQ(std::memcmp(&r.logprob, &lsm[1], 4), 0);
}

TEST(SamplerTest, TopKKeepsLargestWithTiesToLowerId) {
  Sampler s(kernels::BestIsa());
  const std::vector<float> logits = {5.0f, 1.0f, 5.0f, 3.0f, 5.0f, 4.0f};
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 2)), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 3)), (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 4)), (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 6)).size(), 6u);
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 0)).size(), 6u);   // off
  EXPECT_EQ(s.KeptIds(logits.data(), 6, Params(1.0f, 60)).size(), 6u);  // k > vocab
}

TEST(SamplerTest, TopPKeepsShortestPrefixReachingP) {
  Sampler s(kernels::BestIsa());
  // Probabilities 0.5, 0.05, 0.25, 0.2 (listed out of order on purpose).
  const std::vector<float> logits = LogitsFor({0.5, 0.05, 0.25, 0.2});
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 0.4f)), (std::vector<int32_t>{0}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 0.6f)), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 0.9f)), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 0.99f)),
            (std::vector<int32_t>{0, 1, 2, 3}));
  // Equal probabilities: the order (p desc, id asc) decides, so the lower ids are kept.
  const std::vector<float> flat(8, 0.0f);
  EXPECT_EQ(s.KeptIds(flat.data(), 8, Params(1.0f, 0, 0.3f)), (std::vector<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, MinPKeepsRelativeToMax) {
  Sampler s(kernels::BestIsa());
  const std::vector<float> logits = LogitsFor({0.5, 0.05, 0.25, 0.2});
  // Thresholds 0.3*0.5 = 0.15 and 0.45*0.5 = 0.225.
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 1.0f, 0.3f)),
            (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 1.0f, 0.45f)),
            (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 0, 1.0f, 1.0f)), (std::vector<int32_t>{0}));
}

TEST(SamplerTest, TopKRenormalisesBeforeTopPAndMinP) {
  Sampler s(kernels::BestIsa());
  // Full probabilities 0.4 0.3 0.2 0.1. After top-2: 4/7 = 0.571 and 3/7 = 0.429.
  const std::vector<float> logits = LogitsFor({0.1, 0.4, 0.2, 0.3});
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 2, 0.55f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 2, 0.6f)), (std::vector<int32_t>{1, 3}));
  // min-p relative to the renormalised max: 0.8 * 0.571 = 0.457 > 0.429.
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 2, 1.0f, 0.8f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(1.0f, 2, 1.0f, 0.7f)), (std::vector<int32_t>{1, 3}));
  // Temperature sharpens before the filters: at T = 0.25 p(1) = 0.4^4 / sum = 0.716.
  EXPECT_EQ(s.KeptIds(logits.data(), 4, Params(0.25f, 0, 0.7f)), (std::vector<int32_t>{1}));
}

// The fast paths (candidate cutoff, logit pre-test, fallback) keep exactly the reference set.
TEST(SamplerTest, KeptSetMatchesFullSortReference) {
  std::mt19937 rng(7);
  Sampler s(kernels::BestIsa());
  const int32_t sizes[] = {1, 2, 3, 17, 100, 1000, 32000};
  int cases = 0;
  for (int32_t n : sizes) {
    for (int trial = 0; trial < (n >= 32000 ? 6 : 40); ++trial) {
      std::normal_distribution<float> dist(0.0f, trial % 3 == 0 ? 0.5f : 4.0f);
      std::vector<float> logits(static_cast<size_t>(n));
      for (float& x : logits) x = dist(rng);
      if (trial % 5 == 0 && n > 3) logits[2] = logits[1];  // a tie
      const float ts[] = {1.0f, 0.7f, 1.3f};
      const float tps[] = {1.0f, 0.9f, 0.5f, 0.99f, 0.01f};
      const float mps[] = {0.0f, 0.05f, 0.2f};
      const int32_t ks[] = {0, 1, 5, 40};
      SamplingParams p =
          Params(ts[trial % 3], ks[(trial / 3) % 4], tps[trial % 5], mps[(trial / 2) % 3]);
      ASSERT_EQ(s.KeptIds(logits.data(), n, p), ReferenceKept(logits, p))
          << "n=" << n << " T=" << p.temperature << " k=" << p.top_k << " top_p=" << p.top_p
          << " min_p=" << p.min_p;
      ++cases;
    }
  }
  EXPECT_GT(cases, 200);
}

// Sample == Gumbel-max over KeptIds with the documented noise, recomputed here.
TEST(SamplerTest, SampleIsGumbelMaxOverKeptIds) {
  std::mt19937 rng(3);
  Sampler s(kernels::BestIsa());
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t n = 50;
    std::vector<float> logits(n);
    for (float& x : logits) x = dist(rng);
    SamplingParams p = Params(trial % 2 ? 0.8f : 1.0f, trial % 3 == 0 ? 10 : 0,
                              trial % 4 == 0 ? 0.9f : 1.0f, 0.0f, 1000 + trial);
    const std::vector<int32_t> kept = s.KeptIds(logits.data(), n, p);
    int32_t want = -1;
    double best = -std::numeric_limits<double>::infinity();
    for (int32_t id : kept) {
      const double v =
          double(logits[id] / p.temperature) + kernels::GumbelNoise(p.seed, 2, 17 + trial, id);
      if (v > best) best = v, want = id;
    }
    EXPECT_EQ(s.Sample(logits.data(), n, p, 2, 17 + trial).token, want);
  }
}

// Empirical frequencies over many (position, seed) draws match the softmax probabilities.
TEST(SamplerTest, FrequenciesMatchSoftmax) {
  Sampler s(kernels::BestIsa());
  const std::vector<double> probs = {0.05, 0.4, 0.1, 0.25, 0.2};
  const std::vector<float> logits = LogitsFor(probs);
  const int draws = 40000;
  struct Case {
    SamplingParams p;
    std::vector<double> expect;
  };
  // Top-k = 3 keeps 0.4, 0.25, 0.2, renormalised over 0.85.
  const Case cases[] = {
      {Params(1.0f), probs},
      {Params(1.0f, 3), {0.0, 0.4 / 0.85, 0.0, 0.25 / 0.85, 0.2 / 0.85}},
      // Top-p 0.8: 0.4 + 0.25 + 0.2 = 0.85 >= 0.8, the same three renormalised.
      {Params(1.0f, 0, 0.8f), {0.0, 0.4 / 0.85, 0.0, 0.25 / 0.85, 0.2 / 0.85}},
      // Min-p 0.45: threshold 0.18 keeps the same three.
      {Params(1.0f, 0, 1.0f, 0.45f), {0.0, 0.4 / 0.85, 0.0, 0.25 / 0.85, 0.2 / 0.85}},
  };
  for (const Case& c : cases) {
    std::vector<int> counts(5, 0);
    for (int i = 0; i < draws; ++i) {
      SamplingParams p = c.p;
      p.seed = uint64_t(i % 7);
      counts[size_t(s.Sample(logits.data(), 5, p, 0, i).token)]++;
    }
    double chi2 = 0;
    int dof = -1;
    for (int k = 0; k < 5; ++k) {
      if (c.expect[size_t(k)] == 0.0) {
        EXPECT_EQ(counts[size_t(k)], 0) << "filtered id " << k << " was sampled";
        continue;
      }
      const double e = c.expect[size_t(k)] * draws;
      chi2 += (counts[size_t(k)] - e) * (counts[size_t(k)] - e) / e;
      ++dof;
    }
    // chi-square with <= 4 degrees of freedom: P(chi2 > 25) < 1e-4.
    EXPECT_LT(chi2, 25.0) << "dof " << dof;
  }
  // Temperature: T = 0.5 squares the probabilities (renormalised).
  std::vector<double> sq;
  double z = 0;
  for (double p : probs) z += p * p;
  for (double p : probs) sq.push_back(p * p / z);
  std::vector<int> counts(5, 0);
  for (int i = 0; i < draws; ++i)
    counts[size_t(s.Sample(logits.data(), 5, Params(0.5f, 0, 1.0f, 0.0f, 5), 1, i).token)]++;
  double chi2 = 0;
  for (int k = 0; k < 5; ++k)
    chi2 += std::pow(counts[size_t(k)] - sq[size_t(k)] * draws, 2) / (sq[size_t(k)] * draws);
  EXPECT_LT(chi2, 25.0);
}

// Same inputs give the same bits, on every ISA and every Sampler instance; a different seed does
// not (negative control: the memcmp check can fail).
TEST(SamplerTest, SameInputsSameBitsOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int32_t n = 32000;
  std::vector<float> logits(n);
  for (float& x : logits) x = dist(rng);
  const SamplingParams params[] = {Params(0.0f), Params(1.0f), Params(0.8f, 0, 0.9f, 0.0f, 4),
                                   Params(1.1f, 40, 0.95f, 0.05f, 9)};
  for (const SamplingParams& p : params) {
    std::vector<SampleResult> ref;
    {
      Sampler s(Isa::kScalar);
      for (int64_t pos = 0; pos < 16; ++pos) ref.push_back(s.Sample(logits.data(), n, p, 1, pos));
    }
    for (Isa isa : SupportedIsas()) {
      Sampler s(isa);
      for (int64_t pos = 0; pos < 16; ++pos) {
        SampleResult r = s.Sample(logits.data(), n, p, 1, pos);
        EXPECT_EQ(std::memcmp(&r, &ref[size_t(pos)], sizeof(r)), 0)
            << kernels::IsaName(isa) << " pos " << pos;
      }
    }
    if (p.temperature > 0.0f) {
      SamplingParams other = p;
      other.seed += 1;
      Sampler s(Isa::kScalar);
      int differ = 0;
      for (int64_t pos = 0; pos < 16; ++pos) {
        SampleResult r = s.Sample(logits.data(), n, other, 1, pos);
        differ += std::memcmp(&r, &ref[size_t(pos)], sizeof(r)) != 0;
      }
      EXPECT_GT(differ, 0) << "a different seed never changed a sample";
    }
  }
}

// The noise depends on (seed, sample_index, position, token) only: changing the logit of an id
// that the filters drop leaves the sampled token alone; each key changes some draws.
TEST(SamplerTest, NoiseKeyedOnSeedIndexPositionToken) {
  Sampler s(kernels::BestIsa());
  std::vector<float> logits = {2.0f, 1.9f, 1.8f, -5.0f, 1.7f, 1.6f};
  const SamplingParams p = Params(1.0f, 4, 1.0f, 0.0f, 77);
  std::vector<int32_t> base;
  for (int64_t pos = 0; pos < 64; ++pos)
    base.push_back(s.Sample(logits.data(), 6, p, 0, pos).token);
  std::vector<float> changed = logits;
  changed[5] = -3.0f;  // dropped by top-4 either way
  changed[3] = -4.0f;
  for (int64_t pos = 0; pos < 64; ++pos) {
    EXPECT_EQ(s.Sample(changed.data(), 6, p, 0, pos).token, base[size_t(pos)]);
  }
  auto count_diff = [&](uint64_t seed, uint32_t idx, int64_t shift) {
    SamplingParams q = p;
    q.seed = seed;
    int d = 0;
    for (int64_t pos = 0; pos < 64; ++pos) {
      d += s.Sample(logits.data(), 6, q, idx, pos + shift).token != base[size_t(pos)];
    }
    return d;
  };
  EXPECT_EQ(count_diff(77, 0, 0), 0);
  EXPECT_GT(count_diff(78, 0, 0), 10);
  EXPECT_GT(count_diff(77, 1, 0), 10);
  EXPECT_GT(count_diff(77, 0, 1000), 10);
}

TEST(SamplerTest, LogProbMatchesSampleAndKernelLogSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int32_t n = 1000;
  std::vector<float> logits(n);
  for (float& x : logits) x = dist(rng);
  Sampler s(kernels::BestIsa());
  for (float t : {0.0f, 1.0f, 0.7f, 1.5f}) {
    const SamplingParams p = Params(t, 20, 0.9f, 0.01f, 3);
    std::vector<float> scaled(logits);
    const float tt = t > 0.0f ? t : 1.0f;
    for (float& x : scaled) x = x / tt;
    std::vector<float> lsm(n);
    kernels::LogSoftmax(Isa::kScalar, scaled.data(), n, lsm.data());
    for (int64_t pos = 0; pos < 20; ++pos) {
      const SampleResult r = s.Sample(logits.data(), n, p, 0, pos);
      ASSERT_GE(r.token, 0);
      ASSERT_LT(r.token, n);
      EXPECT_EQ(std::memcmp(&r.logprob, &lsm[size_t(r.token)], 4), 0);
      const float lp = s.LogProb(logits.data(), n, p, r.token);
      EXPECT_EQ(std::memcmp(&lp, &r.logprob, 4), 0);
    }
    // Forced tokens outside the kept set still score under the full distribution.
    const float lp7 = s.LogProb(logits.data(), n, p, 7);
    EXPECT_EQ(std::memcmp(&lp7, &lsm[7], 4), 0);
  }
  EXPECT_TRUE(std::isnan(s.LogProb(logits.data(), n, Params(1.0f), n)));
  EXPECT_TRUE(std::isnan(s.LogProb(logits.data(), n, Params(1.0f), -1)));
}

TEST(SamplerTest, ValidateSamplingParams) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}).ok());
  EXPECT_TRUE(ValidateSamplingParams(Params(0.0f, 5, 0.5f, 1.0f)).ok());
  EXPECT_EQ(ValidateSamplingParams(Params(-0.1f)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(NAN)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(INFINITY)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, -1)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0, 0.0f)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0, 1.01f)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0, NAN)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0, 1.0f, -0.1f)).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(ValidateSamplingParams(Params(1.0f, 0, 1.0f, 1.5f)).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(ValidateSamplingParams(Params(1.0f, 0, 2.0f)).message().find("top_p"),
            std::string::npos);
}

// Issue 12 item 7: a positive temperature below 1e-6 is refused (it gave NaN logprobs).
TEST(SamplerTest, TinyTemperatureIsInvalid) {
  for (float t : {1e-45f, 1e-38f, 1e-20f, 9.9e-7f}) {
    const Status s = ValidateSamplingParams(Params(t));
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << t;
    EXPECT_NE(s.message().find("temperature must be 0 (greedy) or >= 1e-06"), std::string::npos)
        << s.message();
  }
  for (float t : {0.0f, 1e-6f, 0.7f, 1e30f, std::numeric_limits<float>::max()}) {
    EXPECT_TRUE(ValidateSamplingParams(Params(t)).ok()) << t;
  }
}

// A scale that overflows fp32 (a tiny temperature, reached here by calling the sampler without
// validation) samples the argmax and scores it exactly as T == 0 does: never NaN. On typical
// logits, T = 1e-38 and 1e-45 overflow and must equal greedy bit for bit.
TEST(SamplerTest, OverflowedScaleEqualsGreedyNeverNaN) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(32000);
  for (float& x : logits) x = nd(rng);
  const int32_t n = int32_t(logits.size());
  for (Isa isa : SupportedIsas()) {
    Sampler s(isa);
    const SampleResult g = s.Sample(logits.data(), n, Params(0.0f), 0, 5);
    for (float t : {1e-38f, 1e-45f}) {
      for (const SamplingParams& p : {Params(t), Params(t, 40, 0.9f, 0.05f)}) {
        const SampleResult r = s.Sample(logits.data(), n, p, 3, 5);
        EXPECT_FALSE(std::isnan(r.logprob)) << t;
        EXPECT_EQ(r.token, g.token) << t;
        EXPECT_EQ(std::memcmp(&r.logprob, &g.logprob, 4), 0) << t << " " << r.logprob;
        const float lp = s.LogProb(logits.data(), n, p, r.token);
        EXPECT_EQ(std::memcmp(&lp, &r.logprob, 4), 0) << t << " " << lp;
      }
    }
    // All-negative logits overflow to -inf: the same.
    std::vector<float> neg(logits);
    for (float& x : neg) x = -std::fabs(x) - 1.0f;
    const SampleResult gn = s.Sample(neg.data(), n, Params(0.0f), 0, 5);
    const SampleResult rn = s.Sample(neg.data(), n, Params(1e-45f), 0, 5);
    EXPECT_EQ(rn.token, gn.token);
    EXPECT_EQ(std::memcmp(&rn.logprob, &gn.logprob, 4), 0) << rn.logprob;
  }
}

// Every valid combination at the edges of the ranges gives a token in range and a finite
// logprob (or -inf for a token whose probability underflows), never NaN.
TEST(SamplerTest, ValidEdgeParamsNeverGiveNaN) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 5.0f);
  std::vector<float> logits(4096);
  for (float& x : logits) x = nd(rng);
  logits[17] = 80.0f;  // a dominant id
  const int32_t n = int32_t(logits.size());
  const float fmax = std::numeric_limits<float>::max();
  Sampler s(kernels::BestIsa());
  int checked = 0;
  for (float t : {0.0f, 1e-6f, 1e-3f, 1.0f, 1e30f, fmax}) {
    for (int32_t k : {0, 1, 2, n, std::numeric_limits<int32_t>::max()}) {
      for (float top_p : {1e-45f, 0.5f, 1.0f}) {
        for (float min_p : {0.0f, 1e-45f, 0.5f, 1.0f}) {
          const SamplingParams p = Params(t, k, top_p, min_p, ~0ull);
          ASSERT_TRUE(ValidateSamplingParams(p).ok());
          for (int64_t pos : {int64_t{1}, int64_t{1} << 40}) {
            const SampleResult r = s.Sample(logits.data(), n, p, 0xFFFFFFFFu, pos);
            ASSERT_GE(r.token, 0);
            ASSERT_LT(r.token, n);
            EXPECT_FALSE(std::isnan(r.logprob))
                << "t=" << t << " k=" << k << " top_p=" << top_p << " min_p=" << min_p;
            const float lp = s.LogProb(logits.data(), n, p, r.token);
            EXPECT_EQ(std::memcmp(&lp, &r.logprob, 4), 0);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * 5 * 3 * 4 * 2);
}

TEST(SamplerTest, HostileInputsNeverLeaveTheVocabulary) {
  Sampler s(kernels::BestIsa());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {nan, nan, nan}, {nan, 1.0f, 2.0f}, {1.0f, inf, 0.0f}, {-inf, -inf, -inf}, {3.0f}};
  const SamplingParams params[] = {Params(0.0f), Params(1.0f), Params(1.0f, 2, 0.5f, 0.5f),
                                   Params(1e-30f), Params(1.0f, 0, 1.0f, 1.0f)};
  for (const auto& row : rows) {
    for (const SamplingParams& p : params) {
      const SampleResult r = s.Sample(row.data(), int32_t(row.size()), p, 0, 3);
      EXPECT_GE(r.token, 0);
      EXPECT_LT(r.token, int32_t(row.size()));
    }
  }
  EXPECT_EQ(s.Sample(nullptr, 0, Params(1.0f), 0, 0).token, -1);
  // A temperature so small that logits / T overflows samples the argmax.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.Sample(logits.data(), 3, Params(1e-38f), 0, 0).token, 1);
}

}  // namespace
}  // namespace bitroll::engine
