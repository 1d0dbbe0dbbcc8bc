// engine/sampler.cc: the fixed-order sampler (see the header).
#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/philox_simd.h"

namespace bitroll::engine {
namespace {

// Lowest index of the maximum. NaN never wins; a row without a comparable maximum returns 0.
int32_t ArgMax(kernels::Isa isa, const float* x, int32_t n) {
  const float m = kernels::MaxValue(isa, x, n);
  for (int32_t i = 0; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;
}

// out[i] = x[i] / t. IEEE division is correctly rounded, so the 4-wide SSE2 division (baseline
// x86-64) gives the same bits as the scalar one; it is only faster.
void DivideAll(const float* x, float t, int32_t n, float* out) {
  int32_t i = 0;
#if defined(__SSE2__)
  const __m128 tv = _mm_set1_ps(t);
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_div_ps(_mm_loadu_ps(x + i), tv));
#endif
  for (; i < n; ++i) out[i] = x[i] / t;
}

// A total order key for top-k: NaN sorts below -inf so the comparator stays a strict weak order.
float SortKey(float v) {
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

// Log-softmax at `token` with kernels::LogSoftmax's formula.
float LogSoftmaxAt(kernels::Isa isa, const float* x, int32_t n, int32_t token) {
  const float m = kernels::MaxValue(isa, x, n);
  const float s = kernels::SumExpShifted(isa, x, n, m);
  return (x[token] - m) - kernels::Log(s);
}

// Stable LSD radix sort of (p, id) pairs, given in ascending id order, into (p desc, id asc)
// order: the same total order a comparison sort by (p desc, id asc) gives, in O(n).
// REQUIRES: every p >= 0 (its bit pattern then orders like its value).
void SortByProbDesc(std::vector<std::pair<float, int32_t>>* v,
                    std::vector<std::pair<float, int32_t>>* tmp) {
  const size_t n = v->size();
  if (n < 2) return;
  tmp->resize(n);
  auto key = [](float f) { return ~std::bit_cast<uint32_t>(f); };  // descending
  std::vector<std::pair<float, int32_t>>* src = v;
  std::vector<std::pair<float, int32_t>>* dst = tmp;
  for (int shift = 0; shift < 32; shift += 8) {
    size_t count[257] = {};
    for (const auto& e : *src) ++count[((key(e.first) >> shift) & 0xFF) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (const auto& e : *src) (*dst)[count[(key(e.first) >> shift) & 0xFF]++] = e;
    std::swap(src, dst);
  }
  // Four passes: the result is back in *v.
}

}  // namespace

Sampler::Sampler(kernels::Isa isa) : isa_(isa) {}

void Sampler::Filter(const float* logits, int32_t vocab, const SamplingParams& p) {
  kept_.clear();
  const float t = p.temperature;
  greedy_ = !(t > 0.0f);
  if (!greedy_) {
    scaled_.resize(size_t(vocab));
    DivideAll(logits, t, vocab, scaled_.data());
    // logits / T overflowed: sample the T -> 0 limit.
    if (!std::isfinite(kernels::MaxValue(isa_, scaled_.data(), vocab))) greedy_ = true;
  }
  if (greedy_) {
    kept_.push_back(ArgMax(isa_, logits, vocab));
    return;
  }
  const float* scaled = scaled_.data();

  // Step 2: top-k. K is either all ids (k_all) or ids_[0..n) ascending, values_ their values.
  const bool k_all = !(p.top_k > 0 && p.top_k < vocab);
  int32_t n = vocab;
  if (!k_all) {
    n = p.top_k;
    // The k-th largest key by selection on a copy of the keys, then the ids above it plus the
    // lowest-id ties at it: the same set as a full sort by (value desc, id asc).
    values_.resize(size_t(vocab));
    for (int32_t i = 0; i < vocab; ++i) values_[i] = SortKey(scaled[i]);
    std::nth_element(values_.begin(), values_.begin() + (n - 1), values_.end(),
                     std::greater<float>());
    const float kth = values_[size_t(n - 1)];
    ids_.clear();
    for (int32_t i = 0; i < vocab; ++i) {
      if (SortKey(scaled[i]) > kth) ids_.push_back(i);
    }
    for (int32_t i = 0; i < vocab && int32_t(ids_.size()) < n; ++i) {
      if (SortKey(scaled[i]) == kth) ids_.push_back(i);
    }
    std::sort(ids_.begin(), ids_.end());
    values_.resize(size_t(n));
    for (int32_t j = 0; j < n; ++j) values_[j] = scaled[ids_[j]];
  }
  auto id_of = [&](int32_t j) { return k_all ? j : ids_[j]; };

  const bool use_top_p = p.top_p < 1.0f;
  const bool use_min_p = p.min_p > 0.0f;
  if (!use_top_p && !use_min_p) {
    kept_.resize(size_t(n));
    for (int32_t j = 0; j < n; ++j) kept_[j] = id_of(j);
    return;
  }

  // Step 3: p_j = Exp(v_j - m) / Z over K in lane order.
  const float* vals = k_all ? scaled : values_.data();
  const float m = kernels::MaxValue(isa_, vals, n);
  const float z = kernels::SumExpShifted(isa_, vals, n, m);
  const float p_max = kernels::Exp(m - m) / z;
  const float min_p_threshold = use_min_p ? p.min_p * p_max : 0.0f;

  // Candidates: every id with p >= threshold, where the threshold is the top-p cutoff (no id
  // below it can be in the nucleus: together they hold < 1 - top_p) or, without top-p, min-p's.
  auto collect = [&](float threshold) {
    cand_.clear();
    // Conservative pre-test on the value: v < m + Log(threshold * Z) - 1 implies p < threshold
    // with a margin of a factor e, far beyond Exp's and this test's rounding.
    float v_min = -std::numeric_limits<float>::infinity();
    if (threshold > 0.0f) {
      const float lz = kernels::Log(threshold * z);
      if (std::isfinite(lz)) v_min = m + (lz - 1.0f);
    }
    for (int32_t j = 0; j < n; ++j) {
      if (!(vals[j] >= v_min)) continue;
      const float pj = kernels::Exp(vals[j] - m) / z;
      if (pj >= threshold) cand_.emplace_back(pj, id_of(j));
    }
  };

  size_t len = 0;
  if (use_top_p) {
    const float cutoff = n > 1 ? (1.0f - p.top_p) / float(n - 1) : 0.0f;
    bool reached = false;
    for (int attempt = 0; attempt < 2 && !reached; ++attempt) {
      collect(attempt == 0 ? cutoff : 0.0f);
      // cand_ holds ids in ascending order; order it by (p desc, id asc) and take the shortest
      // prefix whose running sum (in that order) reaches top_p.
      SortByProbDesc(&cand_, &sort_tmp_);
      float cum = 0.0f;
      len = cand_.size();
      for (size_t i = 0; i < cand_.size(); ++i) {
        cum += cand_[i].first;
        if (cum >= p.top_p) {
          reached = true;
          len = i + 1;
          break;
        }
      }
      if (cand_.size() == size_t(n)) break;  // already all of K
    }
    if (use_min_p) {
      size_t keep = 0;
      while (keep < len && cand_[keep].first >= min_p_threshold) ++keep;
      len = keep;
    }
  } else {
    collect(min_p_threshold);
    len = cand_.size();
  }
  for (size_t i = 0; i < len; ++i) kept_.push_back(cand_[i].second);
  if (kept_.empty())
    kept_.push_back(ArgMax(isa_, scaled, vocab));  // only reachable with NaN logits
}

float Sampler::ScaledLogProb(int32_t vocab, int32_t token) const {
  return LogSoftmaxAt(isa_, scaled_.data(), vocab, token);
}

SampleResult Sampler::Sample(const float* logits, int32_t vocab, const SamplingParams& p,
                             uint32_t sample_index, int64_t position) {
  if (vocab < 1) return {-1, std::numeric_limits<float>::quiet_NaN()};
  Filter(logits, vocab, p);
  if (greedy_) {
    const int32_t id = kept_[0];
    // T == 0, and a scale that overflowed (the T -> 0 limit), score at T == 1 (logits / 1 ==
    // logits exactly): log-softmax of an overflowed scale is inf - inf = NaN.
    return {id, LogSoftmaxAt(isa_, logits, vocab, id)};
  }
  // Step 6: Gumbel-max over kept_, starting from its largest value so the kMaxGumbel bound
  // prunes as much as possible.
  const float* scaled = scaled_.data();
  int32_t start = kept_[0];
  for (int32_t id : kept_) {
    if (scaled[id] > scaled[start] || (scaled[id] == scaled[start] && id < start)) start = id;
  }
  int32_t best_id = start;
  double best = double(scaled[start]) + kernels::GumbelNoise(p.seed, sample_index, position, start);
  // Ids that can still win against the first score (the noise is below kMaxGumbel); their
  // uniforms are drawn in blocks, then each is pruned by GumbelUpperBound before any logarithm.
  cand_ids_.clear();
  for (int32_t id : kept_) {
    if (id != start && !(double(scaled[id]) + kernels::kMaxGumbel < best)) cand_ids_.push_back(id);
  }
  constexpr int64_t kBlock = 256;
  double u[kBlock];
  const int64_t n_cand = int64_t(cand_ids_.size());
  for (int64_t b = 0; b < n_cand; b += kBlock) {
    const int64_t len = std::min(kBlock, n_cand - b);
    kernels::UniformOpenBatchIsa(isa_, p.seed, sample_index, position, cand_ids_.data() + b, len,
                                 u);
    for (int64_t j = 0; j < len; ++j) {
      const int32_t id = cand_ids_[size_t(b + j)];
      const double v = double(scaled[id]);
      if (v + kernels::GumbelUpperBound(u[j]) < best) continue;  // exact pruning, no logarithm
      const double s = v + kernels::GumbelFromUniform(u[j]);     // == v + GumbelNoise(..., id)
      if (s > best || (s == best && id < best_id)) {
        best = s;
        best_id = id;
      }
    }
  }
  return {best_id, ScaledLogProb(vocab, best_id)};
}

float Sampler::LogProb(const float* logits, int32_t vocab, const SamplingParams& p, int32_t token) {
  if (vocab < 1 || token < 0 || token >= vocab) return std::numeric_limits<float>::quiet_NaN();
  const float t = p.temperature;
  if (!(t > 0.0f)) return LogSoftmaxAt(isa_, logits, vocab, token);
  scaled_.resize(size_t(vocab));
  DivideAll(logits, t, vocab, scaled_.data());
  // ScaledLogProb's formula and bits; an overflowed scale scores at T == 1, as Sample does.
  const float* x = scaled_.data();
  const float m = kernels::MaxValue(isa_, x, vocab);
  if (!std::isfinite(m)) return LogSoftmaxAt(isa_, logits, vocab, token);
  return (x[token] - m) - kernels::Log(kernels::SumExpShifted(isa_, x, vocab, m));
}

std::vector<int32_t> Sampler::KeptIds(const float* logits, int32_t vocab, const SamplingParams& p) {
  if (vocab < 1) return {};
  Filter(logits, vocab, p);
  std::vector<int32_t> out = kept_;
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace bitroll::engine
