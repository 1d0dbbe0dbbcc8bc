// Engine benchmark (run by hand; never by ctest):
//   build/tests/bench_engine [--models-dir DIR] [--work DIR] [--reps N] [--quick]
//                            [--model stories260K|stories110m] [--batch B] [--threads T]
//   build/tests/bench_engine --attention-suite [--work DIR] [--reps N] [--threads T]
//                            [--kv-dtype f32|bf16] [--weights f32|bf16] [--case SUBSTRING]
//                            [--cases NAME,NAME,...]
//
// --attention-suite: the regimes where attention dominates (docs/benchmarks.md, "Attention"), on
// a random-weight stories110m shape with a 16,448-token context (stories110m-17k, written into
// --work on first use), fp32, greedy: decode tok/s at batch 1 after a 256-, a 4,096- and a
// 16,384-token prompt (16 decode steps after the 4,096 and 16,384 ones), prefill tok/s of 512-,
// 4,096- and 16,384-token prompts (the steps before the first token, default prefill chunking),
// batch 32 of 128-token prompts + 128 generated tokens (decode steps only), batch 32 as two GRPO
// groups of 16 samples (T = 1) of a 2,048-token prompt + 64 generated tokens (the samples share
// the prompt's K/V blocks), and batch-1 decode at context 256 with the attention kernel forced
// to single and to split. --kv-dtype / --weights:
// the KV cache's and the matmul weights' storage; --case: only the cases whose name contains
// SUBSTRING; --cases: only the cases named exactly (scripts/bench-peer.sh runs them this way).
// An unknown argument or value prints this usage and exits 2.
// Rooflines in the same process: the FMA peak (the engine's ISA, --threads threads) and the read
// bandwidth (the same threads, a buffer of max(1 GiB, 4 x L3)) of tests/bench/bench_roofline.h,
// measured before the first case and again after every case's rep; each rep is reported against
// the mean of the two measurements around it, so a neighbour that loads a shared machine for a
// while moves a rep's figure and its roofline together (one pair for the whole run read 321 and
// 476 GFLOP/s on such a machine). A case that decodes also probes the read bandwidth between its
// steps, from its first token on (one pass over 512 MiB, outside the timed steps): its decode
// % of the read bandwidth is the median over its steps of each step's GB/s against the mean of
// the probes just before and after that step, since a shared machine's bandwidth moves within
// the seconds a long prompt's prefill takes ("of the rep's": against the rep's roofline).
// One progress line per case and rep on stderr while the cases run; then on stdout both
// rooflines, and per case and rep "rep N | case | prefill X tok/s | decode Y tok/s" followed by
// prefill GFLOP/s and % of the FMA peak, and decode GFLOP/s and % of the FMA peak (judge batch 32
// by it), bytes read per decode step and GB/s and % of the read bandwidth (judge batch 1 by it);
// then the rep's roofline; then a table of medians (the % columns: the median of the reps' own
// percentages). The flop and byte formulas are the functions under "The attention
// suite's flop and byte counts" below.
//
// Decode tok/s at batch 1, 8, 32, 64 with 1 and 2 threads, and prefill tok/s, on stories260K and
// on a random-weight stories110m (written with make-model into --work on first use), with fp32
// and bf16 weight storage. Also the invariance overhead: the same run with the split-tail
// attention disabled (single only) and with every item split. Reports achieved GFLOP/s (2 flops
// per multiply-add of the matmuls, plus attention) so it can be set against the FMA peak that
// bench_kernels measures. Prints one table; each figure is the median of --reps runs.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/make_model.h"
#include "engine/model_loader.h"
#include "kernels/cpu/isa.h"
#include "tests/bench/bench_flags.h"
#include "tests/bench/bench_roofline.h"
#include "tests/bench/bench_util.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Config {
  int batch;
  int threads;
  std::string attention = "auto";
  kernels::DType storage = kernels::DType::kF32;
  bool sampled = false;  // T=1 top-p 0.9 instead of greedy (llama-bench compares without sampling)
  kernels::DType kv = kernels::DType::kF32;  // KV cache element type
  int64_t kv_cache_bytes = int64_t{1} << 30;
};

using bench::Median;

// Matmul flops per token (2 per multiply-add), excluding attention.
double MatmulFlopsPerToken(const engine::ModelConfig& c) {
  const double dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim;
  const double per_layer = dim * (dim + 2 * kv) + dim * dim + 3 * dim * hidden;
  return 2.0 * (c.n_layers * per_layer + dim * c.vocab_size);
}

std::unique_ptr<engine::CpuEngine> Make(std::shared_ptr<const engine::ModelWeights> w,
                                        const Config& cfg, int step_tokens) {
  engine::CpuEngineParts parts;
  parts.weights = std::move(w);
  parts.options.threads = cfg.threads;
  parts.options.attention = cfg.attention;
  parts.options.max_step_tokens = step_tokens;
  parts.options.kv_cache_bytes = cfg.kv_cache_bytes;
  parts.weight_storage = cfg.storage;
  parts.options.kv_dtype = cfg.kv == kernels::DType::kBF16 ? "bf16" : "f32";
  auto e = engine::CpuEngine::Create(std::move(parts));
  if (!e.ok()) {
    std::fprintf(stderr, "engine: %s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(e).value();
}

// Steady-state decode: `batch` sequences with a 16-token prompt; only steps in which every row is
// a decode row are timed.
double DecodeTokPerSec(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg,
                       int tokens) {
  auto e = Make(w, cfg, 4096);
  for (int i = 0; i < cfg.batch; ++i) {
    engine::SequenceRequest r;
    r.id = i;
    r.prompt.push_back(1);
    for (int k = 0; k < 15; ++k) r.prompt.push_back(3 + (i * 31 + k * 7) % 200);
    r.sampling.temperature = cfg.sampled ? 1.0f : 0.0f;
    r.sampling.top_p = 0.9f;
    r.sample_index = i;
    r.stop.max_tokens = tokens;
    r.stop.stop_at_eos = r.stop.stop_at_bos = false;
    (void)e->Add(r);
  }
  double secs = 0;
  int64_t decoded = 0;
  while (e->HasWork()) {
    auto s = e->Step();
    if (!s.ok()) std::exit(1);
    if (s->tokens_processed == cfg.batch && static_cast<int>(s->tokens.size()) == cfg.batch) {
      secs += s->seconds;
      decoded += cfg.batch;
    }
  }
  return secs > 0 ? decoded / secs : 0.0;
}

double PrefillTokPerSec(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg, int len) {
  auto e = Make(w, cfg, len);
  engine::SequenceRequest r;
  r.id = 1;
  for (int k = 0; k < len; ++k) r.prompt.push_back(3 + (k * 13) % 250);
  r.stop.max_tokens = 1;
  (void)e->Add(r);
  const auto t0 = Clock::now();
  while (e->HasWork()) (void)e->Step();
  return len / std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- The attention suite's flop and byte counts ----

// Element bytes of a storage type: 2 for bf16, else 4 (fp32).
double ElementBytes(kernels::DType t) {
  return t == kernels::DType::kBF16 ? 2.0 : 4.0;
}

// Keys a query at position p reads in `layer`: p + 1, or min(p + 1, W) under a sliding window W.
double KeysRead(const engine::ModelConfig& c, int32_t layer, int64_t p) {
  const int64_t w = c.window(layer);
  return static_cast<double>(w > 0 ? std::min<int64_t>(p + 1, w) : p + 1);
}

// Classifier flops of one row that produces logits: 2 x dim x vocab_size.
double ClassifierFlops(const engine::ModelConfig& c) {
  return 2.0 * c.dim * c.vocab_size;
}

// Attention flops of one query row at position p over all layers: per query head and key read,
// q.k and p.v are head_dim multiply-adds each (2 flops each):
//   sum over layers of n_heads x 4 x head_dim x KeysRead(layer, p).
double AttentionFlopsAt(const engine::ModelConfig& c, int64_t p) {
  double keys = 0;
  for (int32_t l = 0; l < c.n_layers; ++l) keys += KeysRead(c, l, p);
  return 4.0 * c.n_heads * c.head_dim() * keys;
}

// The prefill of `batch` prompts of `prompt` tokens (positions 0 .. prompt - 1 each): every row
// runs the layer matmuls and its attention, only a prompt's last row the classifier (the engine
// computes logits only for rows that pick a token):
//   batch x [(MatmulFlopsPerToken - ClassifierFlops) x prompt + ClassifierFlops
//            + sum over p < prompt of AttentionFlopsAt(p)].
double PrefillFlops(const engine::ModelConfig& c, int batch, int prompt) {
  double attention = 0;
  for (int64_t p = 0; p < prompt; ++p) attention += AttentionFlopsAt(c, p);
  const double matmul = (MatmulFlopsPerToken(c) - ClassifierFlops(c)) * prompt + ClassifierFlops(c);
  return batch * (matmul + attention);
}

// One decode row at position p (it reads p + 1 keys and produces logits):
//   MatmulFlopsPerToken + AttentionFlopsAt(p).
double DecodeRowFlops(const engine::ModelConfig& c, int64_t p) {
  return MatmulFlopsPerToken(c) + AttentionFlopsAt(c, p);
}

// Bytes of the matmul weights a forward step reads once, whatever its rows: every layer's q, k,
// v, o, w1, w2, w3 and the classifier, MatmulFlopsPerToken / 2 parameters, in `storage`:
//   MatmulFlopsPerToken / 2 x ElementBytes(storage).
// The norm vectors and the token embedding rows (< 0.1 MB for stories110m) are left out.
double WeightBytes(const engine::ModelConfig& c, kernels::DType storage) {
  return MatmulFlopsPerToken(c) / 2 * ElementBytes(storage);
}

// K/V bytes one decode row at position p reads: K and V of every key it reads, in every layer:
//   sum over layers of 2 x kv_dim x KeysRead(layer, p) x ElementBytes(kv)
//   (= 2 x n_layers x kv_dim x (p + 1) x ElementBytes(kv) without sliding windows).
double KvBytesAt(const engine::ModelConfig& c, int64_t p, kernels::DType kv) {
  double keys = 0;
  for (int32_t l = 0; l < c.n_layers; ++l) keys += KeysRead(c, l, p);
  return 2.0 * c.kv_dim() * keys * ElementBytes(kv);
}

// A KV budget that holds one full-context sequence (the engine refuses less) and at least 1 GiB:
//   max(1 GiB, 2 x n_layers x kv_dim x ElementBytes(kv) x (max_seq_len rounded up to 64)).
int64_t SuiteKvCacheBytes(const engine::ModelConfig& c, kernels::DType kv) {
  const double positions = (c.max_seq_len + 63) / 64 * 64.0;
  const double full = 2.0 * c.n_layers * c.kv_dim() * ElementBytes(kv) * positions;
  return std::max<int64_t>(int64_t{1} << 30, static_cast<int64_t>(full));
}

// What one ContextRun measured.
struct RunResult {
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_rows = 0;  // rows of the steps before the first token (inclusive)
  int64_t decoded = 0;       // rows of the timed decode steps
  int64_t decode_steps = 0;
  double decode_flops = 0;  // sum of DecodeRowFlops over the timed rows
  double decode_bytes = 0;  // per timed step WeightBytes + its rows' KvBytesAt, summed
  // With a `probe` callback, per timed decode step: its GB/s as a % of the mean of the read
  // bandwidths probed just before and just after it; and every probe's GB/s.
  std::vector<double> step_bw_pct, probe_gbs;
};

// `batch` sequences with a `prompt_len`-token prompt, then `gen` generated tokens each. Times the
// steps before the first token (prefill; default prefill chunking) and the steps in which every
// row is a decode row, and counts the flops and bytes of the decode rows at their positions.
// group > 1: GRPO groups of `group` samples (T = 1) of one prompt each, which share its K/V
// blocks; the bytes of a decode step count a group's shared blocks once (the first
// (prompt_len - 1) / B blocks of B = EngineStats::kv_block_tokens tokens: the block holding the
// last prompt row is copied by every sample that recomputes that row).
// probe (optional): a read-bandwidth measurement in GB/s, run between the steps from the first
// token on (never inside a timed step), so that each decode step is set against the machine's
// bandwidth at its own moment: a shared machine's bandwidth drifts within a second, and a long
// prompt's prefill takes seconds.
RunResult ContextRun(std::shared_ptr<const engine::ModelWeights> w, const Config& cfg,
                     int prompt_len, int gen, int group = 1,
                     const std::function<double()>& probe = nullptr) {
  auto e = Make(w, cfg, 4096);
  for (int i = 0; i < cfg.batch; ++i) {
    engine::SequenceRequest r;
    r.id = i;
    const int prompt_id = group > 1 ? i / group : i;
    r.prompt.push_back(1);
    for (int k = 1; k < prompt_len; ++k) r.prompt.push_back(3 + (prompt_id * 31 + k * 13) % 250);
    r.sampling.temperature = group > 1 ? 1.0f : 0.0f;
    r.sample_index = group > 1 ? i % group : i;
    r.group_id = group > 1 ? static_cast<uint64_t>(prompt_id) + 1 : 0;
    r.stop.max_tokens = gen;
    r.stop.stop_at_eos = r.stop.stop_at_bos = false;
    (void)e->Add(r);
  }
  const engine::ModelConfig& c = w->config;
  const double weight_bytes = WeightBytes(c, cfg.storage);
  const int64_t kv_block = e->stats().kv_block_tokens;
  RunResult out;
  bool first_token = false;
  while (e->HasWork()) {
    auto s = e->Step();
    if (!s.ok()) std::exit(1);
    if (!first_token) {
      out.prefill_s += s->seconds;
      out.prefill_rows += s->tokens_processed;
    }
    if (!s->tokens.empty()) first_token = true;
    double step_gbs = 0;  // > 0: a timed decode step's GB/s
    if (s->tokens_processed == cfg.batch && static_cast<int>(s->tokens.size()) == cfg.batch) {
      out.decode_s += s->seconds;
      out.decoded += cfg.batch;
      ++out.decode_steps;
      double bytes = weight_bytes;
      for (const engine::TokenEvent& t : s->tokens) {
        // The row that produced the token at position t.position ran at t.position - 1.
        out.decode_flops += DecodeRowFlops(c, t.position - 1);
        bytes += KvBytesAt(c, t.position - 1, cfg.kv);
      }
      if (group > 1) {  // every sample but the first of a group reads the shared blocks again
        const int64_t shared = (prompt_len - 1) / kv_block * kv_block;
        const int64_t repeats = cfg.batch - (cfg.batch + group - 1) / group;
        bytes -= repeats * KvBytesAt(c, shared - 1, cfg.kv);
      }
      out.decode_bytes += bytes;
      if (s->seconds > 0) step_gbs = bytes / s->seconds / 1e9;
    }
    if (probe && first_token && (e->HasWork() || step_gbs > 0)) {
      out.probe_gbs.push_back(probe());
      const size_t n = out.probe_gbs.size();
      const double around = n >= 2 ? (out.probe_gbs[n - 2] + out.probe_gbs[n - 1]) / 2 : 0;
      if (step_gbs > 0 && around > 0) out.step_bw_pct.push_back(100 * step_gbs / around);
    }
  }
  return out;
}

// The machine limits of one measurement: bench_roofline.h's FMA peak and read bandwidth.
struct Roofline {
  double peak_gflops = 0;
  double read_gbs = 0;  // 0: not measured (no AVX2 or AVX-512)
};

// The buffer the read bandwidth is measured over: max(1 GiB, 4 x the L3 cache), so that it comes
// from DRAM; empty when `isa` cannot run the probe or the memory is refused.
kernels::ZeroPages RooflineBuffer(kernels::Isa isa) {
  if (!bench::ReadBandwidthSupported(isa)) return {};
  const int64_t l3 = std::max<int64_t>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
  return bench::ReadBandwidthBuffer(std::max<int64_t>(int64_t{1} << 30, 4 * l3));
}

// The FMA peak of `isa` and the read bandwidth with `isa`'s loads over `buf` (not measured when
// it is empty) on `threads` threads. Medians of 21 runs (~5 ms each) and of 7 runs (one pass
// each): about 0.3 s.
Roofline MeasureRoofline(kernels::Isa isa, int threads, const kernels::ZeroPages& buf) {
  Roofline r;
  r.peak_gflops = bench::FmaPeak(isa, threads, 21);
  if (buf.data() == nullptr) return r;
  r.read_gbs = bench::ReadBandwidth(isa, threads, 7, reinterpret_cast<const float*>(buf.data()),
                                    static_cast<int64_t>(buf.size() / sizeof(float)));
  return r;
}

// The mean of two measurements (the ones just before and just after a rep).
Roofline MeanRoofline(const Roofline& a, const Roofline& b) {
  return {(a.peak_gflops + b.peak_gflops) / 2, (a.read_gbs + b.read_gbs) / 2};
}

// 100 * value / limit, or a negative number when the limit was not measured.
double PercentOf(double value, double limit) {
  return limit > 0 ? 100 * value / limit : -1;
}

// "12.3%" for a PercentOf() value, "n/a" for a negative one.
std::string Percent(double percent) {
  if (percent < 0) return "n/a";
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f%%", percent);
  return b;
}

int AttentionSuite(const std::string& work, int reps, int threads, kernels::DType kv,
                   kernels::DType weights, const std::string& only,
                   const std::vector<std::string>& named) {
  // A context of 16,384 + 64 positions: room for the 16,384-token prompt and its decode steps.
  constexpr int32_t kContext = 16384 + 64;
  // stories110m, and the same with 3 kv heads (4 query heads per kv head, the ratio of Llama 3
  // 8B and Qwen3-8B; "gqa" cases), written once into `work`.
  auto load = [&](int32_t kv_heads) -> std::shared_ptr<const engine::ModelWeights> {
    const std::string name = kv_heads == 12 ? "stories110m-17k" : "stories110m-gqa4-17k";
    const std::string dir = work + "/" + name, path = dir + "/model.bin";
    if (!std::filesystem::exists(path)) {
      auto shape = engine::NamedShape("stories110m");
      if (!shape.ok()) return nullptr;
      shape->max_seq_len = kContext;
      shape->n_kv_heads = kv_heads;
      std::filesystem::create_directories(dir);
      std::fprintf(stderr, "writing random-weight %s (%d-token context) to %s ...\n", name.c_str(),
                   kContext, path.c_str());
      if (!engine::WriteRandomModel(*shape, 1, path, dir + "/tokenizer.bin").ok()) {
        std::fprintf(stderr, "cannot write the model\n");
        return nullptr;
      }
    }
    auto lw = engine::LoadModelWeights(path);
    if (!lw.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), lw.status().ToString().c_str());
      return nullptr;
    }
    return std::make_shared<const engine::ModelWeights>(std::move(lw).value());
  };
  struct Case {
    const char* name;
    int batch, prompt, gen;
    const char* attention;
    int group = 1;     // samples per GRPO group (1: every prompt its own)
    bool gqa = false;  // the 3-kv-head model
  };
  // The 4,096- and 16,384-token cases report both the prefill of their prompt and the decode
  // after it.
  const Case cases[] = {
      {"b1 ctx256", 1, 256, 33, "auto"},
      {"b1 ctx256 single", 1, 256, 33, "single"},
      {"b1 ctx256 split", 1, 256, 33, "split"},
      {"b1 ctx4096", 1, 4096, 17, "auto"},
      {"b32 p128+128", 32, 128, 128, "auto"},
      {"b1 prompt 512", 1, 512, 1, "auto"},
      {"b1 ctx16384", 1, 16384, 17, "auto"},
      {"b32 group16 p2048+64", 32, 2048, 65, "auto", 16},
      {"gqa b1 ctx4096", 1, 4096, 17, "auto", 1, true},
      {"gqa b1 ctx16384", 1, 16384, 17, "auto", 1, true},
      {"gqa b32 p128+128", 32, 128, 128, "auto", 1, true},
  };
  for (const std::string& n : named) {
    if (std::none_of(std::begin(cases), std::end(cases),
                     [&](const Case& c) { return n == c.name; })) {
      std::fprintf(stderr, "--cases: no case is named \"%s\"\n", n.c_str());
      return 2;
    }
  }
  auto selected = [&](const Case& c) {
    return std::string(c.name).find(only) != std::string::npos &&
           (named.empty() || std::find(named.begin(), named.end(), c.name) != named.end());
  };
  std::shared_ptr<const engine::ModelWeights> models[2];  // [gqa]
  for (const Case& c : cases) {
    if (selected(c) && models[c.gqa] == nullptr &&
        (models[c.gqa] = load(c.gqa ? 3 : 12)) == nullptr) {
      return 1;
    }
  }

  // The engine runs BestIsa() (EngineOptions::isa "auto") on `threads` threads.
  const kernels::Isa isa = kernels::BestIsa();
  auto print_roofline = [&](const char* when, const Roofline& r) {
    std::printf(
        "roofline %s: FMA peak (%s, threads=%d) %.1f GFLOP/s | read bandwidth (threads=%d) ", when,
        kernels::IsaName(isa), threads, r.peak_gflops, threads);
    if (r.read_gbs > 0)
      std::printf("%.1f GB/s\n", r.read_gbs);
    else
      std::printf("n/a (needs AVX2 or AVX-512)\n");
    std::fflush(stdout);
  };
  const kernels::ZeroPages roofline_buf = RooflineBuffer(isa);
  std::vector<Roofline> probes = {MeasureRoofline(isa, threads, roofline_buf)};
  print_roofline("before", probes.front());

  struct Figures {
    double prefill_tps = 0, decode_tps = 0;
    double prefill_gflops = 0, decode_gflops = 0, decode_gbs = 0, decode_mb_per_step = 0;
    Roofline roof;  // the mean of the measurements just before and just after this rep
    // Per decode step, its GB/s as a % of the bandwidth probed around it (RunResult), and the
    // probes' GB/s.
    std::vector<double> step_bw_pct, probe_gbs;
    double prefill_peak_pct() const { return PercentOf(prefill_gflops, roof.peak_gflops); }
    double decode_peak_pct() const { return PercentOf(decode_gflops, roof.peak_gflops); }
    // The judge at batch 1: the median step against the bandwidth around it (the rep's roofline
    // where nothing was probed).
    double decode_bw_pct() const {
      return step_bw_pct.empty() ? decode_bw_pct_rep() : Median(step_bw_pct);
    }
    double decode_bw_pct_rep() const { return PercentOf(decode_gbs, roof.read_gbs); }
  };
  // One pass of the read-bandwidth probe over the next 512 MiB of the roofline buffer (~10 ms;
  // it reads as a 1 GiB pass does within a few %, docs/benchmarks.md "Issue 19, round 16").
  size_t probe_slice = 0;
  auto probe = [&]() -> double {
    const int64_t n = roofline_buf.size() / sizeof(float), slice = (int64_t{512} << 20) / 4;
    if (roofline_buf.data() == nullptr || n < 2 * slice) return 0;
    const float* base = reinterpret_cast<const float*>(roofline_buf.data());
    const int64_t at = static_cast<int64_t>(probe_slice++ % (n / slice)) * slice;
    return bench::ReadBandwidth(isa, threads, 1, base + at, slice);
  };
  std::vector<std::vector<Figures>> figures(std::size(cases));
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < std::size(cases); ++i) {
      const Case& c = cases[i];
      if (!selected(c)) continue;
      const std::shared_ptr<const engine::ModelWeights>& w = models[c.gqa];
      const engine::ModelConfig& mc = w->config;
      Config cfg{c.batch, threads, c.attention, weights};
      cfg.kv = kv;
      cfg.kv_cache_bytes = SuiteKvCacheBytes(mc, kv);
      const RunResult r =
          ContextRun(w, cfg, c.prompt, c.gen, c.group,
                     c.gen > 1 ? std::function<double()>(probe) : std::function<double()>());
      if (c.group == 1 && r.prefill_rows != int64_t{c.batch} * c.prompt) {
        std::fprintf(stderr, "%s: the steps before the first token ran %lld rows, not %lld\n",
                     c.name, static_cast<long long>(r.prefill_rows),
                     static_cast<long long>(int64_t{c.batch} * c.prompt));
      }
      Figures f;
      if (r.prefill_s > 0 && c.group == 1) {
        f.prefill_tps = static_cast<double>(c.prompt) * c.batch / r.prefill_s;
        f.prefill_gflops = PrefillFlops(mc, c.batch, c.prompt) / r.prefill_s / 1e9;
      } else if (r.prefill_s > 0) {
        // A group's prompt is prefilled once, by its first sample, which then samples the first
        // token; the others wait for it (and later recompute only their last prompt row).
        const int groups = (c.batch + c.group - 1) / c.group;
        const int64_t rows = int64_t{groups} * c.prompt;
        if (r.prefill_rows != rows) {
          std::fprintf(stderr, "%s: the steps before the first token ran %lld rows, not %lld\n",
                       c.name, static_cast<long long>(r.prefill_rows),
                       static_cast<long long>(rows));
        }
        f.prefill_tps = static_cast<double>(r.prefill_rows) / r.prefill_s;
        f.prefill_gflops = PrefillFlops(mc, groups, c.prompt) / r.prefill_s / 1e9;
      }
      if (r.decode_s > 0) {
        f.decode_tps = r.decoded / r.decode_s;
        f.decode_gflops = r.decode_flops / r.decode_s / 1e9;
        f.decode_gbs = r.decode_bytes / r.decode_s / 1e9;
        f.decode_mb_per_step = r.decode_bytes / r.decode_steps / 1e6;
      }
      probes.push_back(MeasureRoofline(isa, threads, roofline_buf));
      f.roof = MeanRoofline(probes[probes.size() - 2], probes.back());
      f.step_bw_pct = r.step_bw_pct;
      f.probe_gbs = r.probe_gbs;
      figures[i].push_back(f);
      // Progress only: the lines with the % of the rooflines follow the last measurement.
      std::fprintf(stderr,
                   "rep %d | %s | prefill %.1f tok/s | decode %.1f tok/s | prefill %.1f GFLOP/s | "
                   "decode %.1f GFLOP/s %.1f GB/s\n",
                   rep, c.name, f.prefill_tps, f.decode_tps, f.prefill_gflops, f.decode_gflops,
                   f.decode_gbs);
    }
  }

  print_roofline("after", probes.back());
  // The run's spread, and the median measurement (scripts/bench-peer.sh falls back to its
  // bandwidth where a rep's line carries none).
  auto spread = [&](double Roofline::*field) {
    std::vector<double> v;
    for (const Roofline& r : probes) v.push_back(r.*field);
    return std::array<double, 3>{Median(v), *std::min_element(v.begin(), v.end()),
                                 *std::max_element(v.begin(), v.end())};
  };
  const auto peak = spread(&Roofline::peak_gflops), bw = spread(&Roofline::read_gbs);
  std::printf(
      "roofline used (each rep against the mean of the measurements just before and after it, "
      "each decode step's GB/s also against the bandwidth probed just before and after that "
      "step; the median of all %zu): FMA peak %.1f GFLOP/s (min %.1f, max %.1f) | read "
      "bandwidth %.1f GB/s (min %.1f, max %.1f)\n",
      probes.size(), peak[0], peak[1], peak[2], bw[0], bw[1], bw[2]);

  // Prefill: GFLOP/s and % of the FMA peak. Decode: GFLOP/s and % of the FMA peak (the judge at
  // batch 32), bytes per step, GB/s and % of the read bandwidth (the judge at batch 1).
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < std::size(cases); ++i) {
      const Case& c = cases[i];
      if (!selected(c)) continue;
      const Figures& f = figures[i][rep];
      std::printf(
          "rep %d | %s | prefill %.1f tok/s | decode %.1f tok/s | prefill %.1f GFLOP/s %s "
          "peak",
          rep, c.name, f.prefill_tps, f.decode_tps, f.prefill_gflops,
          Percent(f.prefill_peak_pct()).c_str());
      if (c.gen > 1) {
        std::printf(
            " | decode %.1f GFLOP/s %s peak, %.1f MB/step %.1f GB/s %s bw (%s of the rep's) | "
            "between the steps %.1f GB/s (median of %zu probes)",
            f.decode_gflops, Percent(f.decode_peak_pct()).c_str(), f.decode_mb_per_step,
            f.decode_gbs, Percent(f.decode_bw_pct()).c_str(),
            Percent(f.decode_bw_pct_rep()).c_str(), f.probe_gbs.empty() ? 0.0 : Median(f.probe_gbs),
            f.probe_gbs.size());
      } else {
        std::printf(" | decode -");
      }
      std::printf(" | roofline %.1f GFLOP/s %.1f GB/s\n", f.roof.peak_gflops, f.roof.read_gbs);
    }
  }
  // Medians over the reps; the % columns are the medians of the reps' own percentages.
  std::printf(
      "| case | threads | prefill tok/s | decode tok/s | prefill GFLOP/s | prefill %% peak | "
      "decode GFLOP/s | decode %% peak | decode MB/step | decode GB/s | decode %% bw | "
      "decode %% bw of the rep's |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    if (!selected(c)) continue;
    auto median = [&](auto get) {
      std::vector<double> v;
      for (const Figures& f : figures[i]) v.push_back(get(f));
      return Median(v);
    };
    auto field = [](double Figures::*m) { return [m](const Figures& f) { return f.*m; }; };
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %s |", c.name, threads,
                median(field(&Figures::prefill_tps)),
                c.gen > 1 ? median(field(&Figures::decode_tps)) : 0.0,
                median(field(&Figures::prefill_gflops)),
                Percent(median([](const Figures& f) { return f.prefill_peak_pct(); })).c_str());
    if (c.gen > 1) {
      std::printf(" %.1f | %s | %.1f | %.1f | %s | %s |\n", median(field(&Figures::decode_gflops)),
                  Percent(median([](const Figures& f) { return f.decode_peak_pct(); })).c_str(),
                  median(field(&Figures::decode_mb_per_step)), median(field(&Figures::decode_gbs)),
                  Percent(median([](const Figures& f) { return f.decode_bw_pct(); })).c_str(),
                  Percent(median([](const Figures& f) { return f.decode_bw_pct_rep(); })).c_str());
    } else {
      std::printf(" - | - | - | - | - | - |\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models_dir = "../shared/models";
  std::string work = "bench-work";
  int reps = 3;
  bool quick = false;
  std::string only_model;
  int only_batch = 0, only_threads = 0;
  bool attention_suite = false;
  std::string kv_dtype = "f32", weights = "f32", only_case;
  std::string cases_list;
  bench::BenchFlags flags;
  flags.strings = {{"--models-dir", &models_dir}, {"--work", &work},       {"--model", &only_model},
                   {"--kv-dtype", &kv_dtype},     {"--weights", &weights}, {"--case", &only_case},
                   {"--cases", &cases_list}};
  flags.ints = {{"--reps", &reps}, {"--batch", &only_batch}, {"--threads", &only_threads}};
  flags.switches = {{"--quick", &quick}, {"--attention-suite", &attention_suite}};
  flags.usage = std::string("usage: ") + argv[0] +
                " [--models-dir DIR] [--work DIR] [--reps N] [--quick]\n"
                "          [--model stories260K|stories110m] [--batch B] [--threads T]\n"
                "       " +
                argv[0] +
                " --attention-suite [--work DIR] [--reps N] [--threads T]\n"
                "          [--kv-dtype f32|bf16] [--weights f32|bf16] [--case SUBSTRING]\n"
                "          [--cases NAME,NAME,...]\n";
  if (!flags.Parse(argv[0], argc, argv)) return flags.ExitStatus();
  for (const std::string* v : {&kv_dtype, &weights}) {
    if (*v != "f32" && *v != "bf16") {
      std::fprintf(stderr, "%s: --kv-dtype and --weights take f32 or bf16, not %s\n%s", argv[0],
                   v->c_str(), flags.usage.c_str());
      return 2;
    }
  }
  std::filesystem::create_directories(work);
  if (attention_suite) {
    return AttentionSuite(work, reps, only_threads > 0 ? only_threads : 2,
                          kv_dtype == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32,
                          weights == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32,
                          only_case, bench::SplitCommas(cases_list));
  }
  const std::string m110 = work + "/stories110m/model.bin";
  if (!std::filesystem::exists(m110)) {
    std::fprintf(stderr, "writing random-weight stories110m to %s ...\n", m110.c_str());
    auto shape = engine::NamedShape("stories110m");
    std::filesystem::create_directories(work + "/stories110m");
    if (!shape.ok() ||
        !engine::WriteRandomModel(*shape, 1, m110, work + "/stories110m/tokenizer.bin").ok()) {
      std::fprintf(stderr, "cannot write the stories110m model\n");
      return 1;
    }
  }
  struct Model {
    std::string name, path;
  };
  std::vector<Model> models = {{"stories260K", models_dir + "/stories260K.bin"},
                               {"stories110m", m110}};
  std::printf("| model | weights | threads | attention | sampling | batch | tok/s | GFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Model& m : models) {
    if (!only_model.empty() && m.name != only_model) continue;
    auto lw = engine::LoadModelWeights(m.path);
    if (!lw.ok()) {
      std::fprintf(stderr, "%s: %s\n", m.path.c_str(), lw.status().ToString().c_str());
      continue;
    }
    auto w = std::make_shared<const engine::ModelWeights>(std::move(lw).value());
    const double flops = MatmulFlopsPerToken(w->config);
    const bool big = m.name == "stories110m";
    const int tokens = big ? (quick ? 16 : 48) : 128;
    std::vector<Config> configs;
    for (kernels::DType st : {kernels::DType::kF32, kernels::DType::kBF16}) {
      if (!big && st == kernels::DType::kBF16) continue;
      for (int threads : {1, 2}) {
        for (int batch : {1, 8, 32, 64}) configs.push_back({batch, threads, "auto", st});
      }
    }
    if (big) {
      for (const char* att : {"single", "split"}) {
        for (int batch : {1, 32}) configs.push_back({batch, 2, att, kernels::DType::kF32});
      }
    }
    for (int batch : {1, 32}) configs.push_back({batch, 2, "auto", kernels::DType::kF32, true});
    for (const Config& c : configs) {
      if ((only_batch && c.batch != only_batch) || (only_threads && c.threads != only_threads))
        continue;
      std::vector<double> r;
      for (int i = 0; i < reps; ++i) r.push_back(DecodeTokPerSec(w, c, tokens));
      const double tps = Median(r);
      std::printf("| %s | %s | %d | %s | %s | %d | %.1f | %.1f |\n", m.name.c_str(),
                  c.storage == kernels::DType::kBF16 ? "bf16" : "f32", c.threads,
                  c.attention.c_str(), c.sampled ? "T=1 top-p 0.9" : "greedy", c.batch, tps,
                  tps * flops / 1e9);
      std::fflush(stdout);
    }
    for (int threads : {1, 2}) {
      if (only_batch || (only_threads && threads != only_threads)) continue;
      std::vector<double> r;
      const int len = big ? 512 : 256;
      for (int i = 0; i < reps; ++i) r.push_back(PrefillTokPerSec(w, {1, threads}, len));
      std::printf("| %s | f32 | %d | auto | - | prefill %d | %.1f | %.1f |\n", m.name.c_str(),
                  threads, len, Median(r), Median(r) * flops / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
