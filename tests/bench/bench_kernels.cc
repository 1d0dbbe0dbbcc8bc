// bench_kernels: measured machine limits (FMA peak, read bandwidth, ThreadPool latency) and Matmul
// throughput on the stories110m shapes, as % of those limits. Run by hand, briefly:
//   build/kernels/bench_kernels [--isa=auto|scalar|avx2|avx512] [--reps=5] [--quick] [--clock=cpu]
//                               [--attention[=CASE] [--kv-consecutive] [--kv-hugepages]
//                               [--kv-layers=N]] [--matmul[=CASE] [--m=M,...] [--bf16]]
// --attention runs only the attention cases (stories110m heads: 12 x 64, block size 16): decode
// at batch 1 (contexts 256, 4,096 and 16,384) and batch 32 (contexts 129-255), also with a bf16
// KV pool ("bf16kv"; KV GB/s counts the K/V bytes a decode row streams), and prefill of 512 and
// 4,096 rows of one sequence in 256-row calls as the engine chunks them (also with a sliding
// window of 128 and 1,024 keys: "W128", "W1024"), with the single-worker, split-tail and auto
// kernels on 1 and 2 threads; --attention=CASE only the cases whose name
// contains CASE (e.g. --attention=decode). The KV pool: each sequence's blocks take every other
// block id, interleaved with the other sequences' (a busy cache), or with --kv-consecutive
// consecutive ids (one sequence in a fresh cache). --kv-hugepages: huge pages for the
// pool (the engine's KvCache does not). --kv-layers=N: N copies of the pool, the calls taking
// turns as the engine's layers do, so the K/V come from memory, not from the cache (by default
// a case's K/V, up to ~67 MB, may stay partly in the L3 from one call to the next).
// --matmul runs only the matmul cases at the engine's batch sizes: the stories110m shapes qkv
// (N=2304 K=768), wo (768x768), w13 (4096x768), w2 (768x2048), cls (32000x768) and "model" (all
// of one forward's matmuls, weights streaming from DRAM) at M = --m=LIST (default
// 1,2,16,32,64,128,256,512), fp32 weights or --bf16; --matmul=CASE only the cases whose name
// contains CASE (e.g. --matmul=model).
// Every figure is the median of --reps repetitions; each repetition runs for >= ~20 ms.
// --clock=wall (default) times with the wall clock. --clock=cpu divides the process CPU time by the
// thread count instead: on a shared, oversubscribed machine this estimates what the code does when
// it has the cores to itself (spin-waits count as busy, so multi-thread figures are pessimistic).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/math.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/bench/bench_roofline.h"
#include "tests/bench/bench_util.h"

namespace bk = bitroll::kernels;

namespace {

// The bench's clock: wall time, or process CPU time divided by the threads in use.
using Clock = bitroll::bench::BenchClock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return b - a;
}

using bitroll::bench::Median;

// Seconds per call of fn: repeats until >= min_s has passed; median over reps.
double TimePerCall(const std::function<void()>& fn, int reps, double min_s = 0.02) {
  fn();  // warm up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    int64_t calls = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = Seconds(t0, Clock::now());
    } while (elapsed < min_s);
    times.push_back(elapsed / static_cast<double>(calls));
  }
  return Median(times);
}

using bitroll::bench::FmaPeak;

// The read bandwidth of the AVX-512 sum (this bench measures it only where AVX-512 runs).
double ReadBandwidth(int threads, int reps, const float* buf, int64_t n) {
  return bitroll::bench::ReadBandwidth(bk::Isa::kAvx512, threads, reps, buf, n);
}

struct Shape {
  const char* name;
  int64_t n, k;
};

// ---- Attention on the stories110m head shape ----

// A KV pool of anonymous pages, as engine/kv_cache.cc maps it; `huge`: 2 MiB pages where the
// kernel grants them (kernels/cpu/zero_pages.h).
template <typename T>
class KvPool {
 public:
  KvPool(size_t n, bool huge) {
    if (!z_.Map(n * sizeof(T), huge)) std::abort();
  }
  T* data() { return reinterpret_cast<T*>(z_.data()); }
  size_t size() const { return z_.size() / sizeof(T); }
  T& operator[](size_t i) { return data()[i]; }

 private:
  bk::ZeroPages z_;
};

// One attention workload: its rows, passed to Attention() rows_per_call at a time.
struct AttentionCase {
  const char* name;
  std::vector<int32_t> positions;  // all rows of all calls
  std::vector<int32_t> sequence;   // the sequence (block table) of each row
  int32_t rows_per_call;
  bk::DType kv = bk::DType::kF32;  // the KV pool's element type
  int32_t window = 0;              // sliding window W (0 = full attention)
  // Sequences s and s' with s / group == s' / group share their first shared_blocks block ids
  // (GRPO siblings decoding after one prompt); 0: no sharing.
  int32_t group = 0, shared_blocks = 0;
  // Head shape: stories110m's by default; the GQA cases take Llama 3 8B's and Qwen3-8B's
  // (32 query heads over 8 kv heads of 128).
  int32_t heads = 12, kv_heads = 12, head_dim = 64;
};

int BenchAttention(bk::Isa isa, int reps, const std::string& only, bool consecutive, bool hugepages,
                   int kv_layers) {
  constexpr int32_t kBlock = 16;
  std::vector<AttentionCase> cases;
  cases.push_back({"decode b1 ctx256", {255}, {0}, 1});
  cases.push_back({"decode b1 ctx4096", {4095}, {0}, 1});
  cases.push_back({"decode b1 ctx16384", {16383}, {0}, 1});
  {
    AttentionCase c{"decode b32 ctx129-255", {}, {}, 32};
    for (int32_t i = 0; i < 32; ++i) {
      c.positions.push_back(128 + 4 * i);
      c.sequence.push_back(i);
    }
    cases.push_back(c);
  }
  {
    // Two GRPO groups of 16 samples decoding after a shared 2,048-token prompt (128 blocks), each
    // sample 0-62 tokens into its own continuation.
    AttentionCase c{"decode b32 siblings ctx2048", {}, {}, 32};
    for (int32_t i = 0; i < 32; ++i) {
      c.positions.push_back(2048 + 2 * i);
      c.sequence.push_back(i);
    }
    c.group = 16;
    c.shared_blocks = 2048 / kBlock;
    cases.push_back(c);
    // The same rows after a 128-token prompt: each sample's own 1,920-1,982 tokens dominate
    // (GRPO on short prompts with long answers).
    c.name = "decode b32 siblings p128 ctx2048";
    c.shared_blocks = 128 / kBlock;
    cases.push_back(c);
  }
  for (size_t i = 1, n = cases.size(); i < n; ++i) {  // the decode cases again, with a bf16 cache
    AttentionCase c = cases[i];
    c.name = i == 1   ? "decode b1 ctx4096 bf16kv"
             : i == 2 ? "decode b1 ctx16384 bf16kv"
             : i == 3 ? "decode b32 ctx129-255 bf16kv"
             : i == 4 ? "decode b32 siblings ctx2048 bf16kv"
                      : "decode b32 siblings p128 ctx2048 bf16kv";
    c.kv = bk::DType::kBF16;
    cases.push_back(c);
  }
  // Grouped-query variants of case `base`: 32 query heads over 8 kv heads, fp32 and bf16 caches.
  auto add_gqa = [&](size_t base, int32_t head_dim, const char* name, const char* bf16_name) {
    AttentionCase c = cases[base];
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = head_dim;
    c.name = name;
    cases.push_back(c);
    c.name = bf16_name;
    c.kv = bk::DType::kBF16;
    cases.push_back(c);
  };
  // Batch-1 and batch-32 decode at head_dim 128 (Llama 3 8B, Qwen3-8B).
  add_gqa(0, 128, "decode b1 ctx256 gqa", "decode b1 ctx256 gqa bf16kv");
  add_gqa(1, 128, "decode b1 ctx4096 gqa", "decode b1 ctx4096 gqa bf16kv");
  add_gqa(2, 128, "decode b1 ctx16384 gqa", "decode b1 ctx16384 gqa bf16kv");
  add_gqa(3, 128, "decode b32 ctx129-255 gqa", "decode b32 ctx129-255 gqa bf16kv");
  // The same ratio at head_dim 64 (Llama 3.2 1B; bench_engine's "gqa" model has 12 query heads
  // over 3): each chunk's per-head work (max, exp, sum, merge) weighs twice as much against its
  // dot products as at 128.
  add_gqa(1, 64, "decode b1 ctx4096 gqa hd64", "decode b1 ctx4096 gqa hd64 bf16kv");
  add_gqa(2, 64, "decode b1 ctx16384 gqa hd64", "decode b1 ctx16384 gqa hd64 bf16kv");
  // bench_engine's "gqa" model: 12 query heads over 3 kv heads, so 2 threads split the third
  // kv unit's chunks (the split-tail kernel with grouped-query units).
  const size_t hd64_16k = cases.size() - 2;  // the two cases just added: fp32, then bf16
  for (size_t i = 0; i < 2; ++i) {
    AttentionCase c = cases[hd64_16k + i];
    c.heads = 12;
    c.kv_heads = 3;
    c.name = i == 0 ? "decode b1 ctx16384 gqa3 hd64" : "decode b1 ctx16384 gqa3 hd64 bf16kv";
    cases.push_back(c);
  }
  for (int32_t len : {512, 4096}) {
    AttentionCase c{len == 512 ? "prefill 512" : "prefill 4096", {}, {}, 256};
    for (int32_t t = 0; t < len; ++t) {
      c.positions.push_back(t);
      c.sequence.push_back(0);
    }
    cases.push_back(c);
  }
  for (int32_t w : {128, 1024}) {  // the 4,096-row prefill through a sliding window
    AttentionCase c = cases.back();
    c.name = w == 128 ? "prefill 4096 W128" : "prefill 4096 W1024";
    c.window = w;
    cases.push_back(c);
  }
  std::printf("\n%-27s %6s %3s %11s %9s %9s\n", "attention", "kernel", "thr", "us/call", "GFLOP/s",
              "KV GB/s");
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0, 1.0f);
  for (const AttentionCase& c : cases) {
    if (std::string(c.name).find(only) == std::string::npos) continue;
    int32_t n_seq = 0, max_pos = 0;
    for (size_t i = 0; i < c.positions.size(); ++i) {
      n_seq = std::max(n_seq, c.sequence[i] + 1);
      max_pos = std::max(max_pos, c.positions[i]);
    }
    const int32_t blocks_per_seq = max_pos / kBlock + 1;
    // Each sequence's blocks are spread over the pool (every other block id), as a busy cache has.
    std::vector<std::vector<int32_t>> tables(n_seq);
    for (int32_t s = 0; s < n_seq; ++s) {
      for (int32_t b = 0; b < blocks_per_seq; ++b) {
        tables[s].push_back(consecutive ? s * blocks_per_seq + b : 2 * (b * n_seq + s));
      }
      if (c.group > 0) {  // the group's first sequence's blocks
        const int32_t leader = s / c.group * c.group;
        for (int32_t b = 0; b < c.shared_blocks; ++b) tables[s][b] = tables[leader][b];
      }
    }
    const int64_t pool_floats =
        int64_t{2} * n_seq * blocks_per_seq * c.kv_heads * c.head_dim * kBlock;
    KvPool<float> kc(pool_floats, hugepages), vc(pool_floats, hugepages);
    for (int64_t i = 0; i < pool_floats; ++i) kc[i] = dist(rng);
    for (int64_t i = 0; i < pool_floats; ++i) vc[i] = dist(rng);
    const size_t n16 = c.kv == bk::DType::kBF16 ? pool_floats : 1;
    KvPool<uint16_t> kc16(n16, hugepages), vc16(n16, hugepages);
    if (c.kv == bk::DType::kBF16) {
      for (int64_t i = 0; i < pool_floats; ++i) kc16[i] = bk::F32ToBf16(kc[i]);
      for (int64_t i = 0; i < pool_floats; ++i) vc16[i] = bk::F32ToBf16(vc[i]);
    }
    // kv_layers - 1 more copies of the pool: call i reads copy i % kv_layers, as the engine's
    // layers take turns: with enough copies, none is still in the cache when its turn comes.
    const size_t pool_bytes = pool_floats * (c.kv == bk::DType::kBF16 ? 2 : 4);
    std::vector<std::pair<const void*, const void*>> layers;
    std::vector<std::unique_ptr<KvPool<char>>> copies;
    layers.emplace_back(
        c.kv == bk::DType::kBF16 ? static_cast<const void*>(kc16.data()) : kc.data(),
        c.kv == bk::DType::kBF16 ? static_cast<const void*>(vc16.data()) : vc.data());
    for (int l = 1; l < kv_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        copies.push_back(std::make_unique<KvPool<char>>(pool_bytes, hugepages));
        std::memcpy(copies.back()->data(), kv == 0 ? layers[0].first : layers[0].second,
                    pool_bytes);
      }
      layers.emplace_back(copies[copies.size() - 2]->data(), copies.back()->data());
    }
    size_t layer = 0;
    const double elem = c.kv == bk::DType::kBF16 ? 2.0 : 4.0;
    const int64_t n = static_cast<int64_t>(c.positions.size());
    std::vector<float> q(n * c.heads * c.head_dim), out(q.size());
    for (float& v : q) v = dist(rng);
    std::vector<const int32_t*> row_tables(n);
    // K/V bytes: each decode row reads its whole context, a block shared by several rows
    // counted once (the bytes the call must bring in at least).
    double flops = 0, kv_bytes = 0;
    std::map<int32_t, int32_t> block_keys;  // block id -> the most keys a row reads from it
    for (int64_t i = 0; i < n; ++i) {
      row_tables[i] = tables[c.sequence[i]].data();
      const int32_t keys = c.window > 0 ? std::min(c.window, c.positions[i] + 1)
                                        : c.positions[i] + 1;  // the keys it attends to
      flops += 4.0 * c.heads * c.head_dim * keys;
      for (int32_t first = 0; first <= c.positions[i]; first += kBlock) {
        int32_t& most = block_keys[row_tables[i][first / kBlock]];
        most = std::max(most, std::min(kBlock, c.positions[i] + 1 - first));
      }
    }
    for (const auto& [block, keys] : block_keys)
      kv_bytes += 2.0 * elem * c.kv_heads * c.head_dim * keys;
    if (c.rows_per_call > 1 && c.sequence.back() == 0) kv_bytes = 0;  // prefill: not a stream
    for (bk::AttentionKernel kernel :
         {bk::AttentionKernel::kAuto, bk::AttentionKernel::kSingle, bk::AttentionKernel::kSplit}) {
      for (int threads : {1, 2}) {
        bk::ThreadPool pool(threads);
        bk::AttentionScratch scratch;
        Clock::threads = threads;
        const double t = TimePerCall(
            [&] {
              for (int64_t r0 = 0; r0 < n; r0 += c.rows_per_call) {
                bk::AttentionParams p;
                p.n_tokens = static_cast<int32_t>(std::min<int64_t>(c.rows_per_call, n - r0));
                p.n_heads = c.heads;
                p.n_kv_heads = c.kv_heads;
                p.head_dim = c.head_dim;
                p.block_size = kBlock;
                p.q = q.data() + r0 * c.heads * c.head_dim;
                p.out = out.data() + r0 * c.heads * c.head_dim;
                p.k_cache = layers[layer].first;
                p.v_cache = layers[layer].second;
                layer = (layer + 1) % layers.size();
                p.kv_dtype = c.kv;
                p.positions = c.positions.data() + r0;
                p.block_tables = row_tables.data() + r0;
                p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
                p.window = c.window;
                bk::Attention(isa, p, kernel, &pool, &scratch);
              }
            },
            reps);
        std::printf("%-27s %6s %3d %11.1f %9.1f %9.1f\n", c.name, bk::AttentionKernelName(kernel),
                    threads, t * 1e6, flops / t / 1e9, kv_bytes / t / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

// ---- Matmul at the engine's batch sizes (--matmul) ----

// One matrix per stories110m layer matmul and the classifier (the engine's shapes).
struct MatmulCase {
  const char* name;
  int64_t n, k;
};
constexpr MatmulCase kMatmulCases[] = {{"qkv", 2304, 768},
                                       {"wo", 768, 768},
                                       {"w13", 4096, 768},
                                       {"w2", 768, 2048},
                                       {"cls", 32000, 768}};

// Runs only the matmul cases: every shape of kMatmulCases whose name contains `only` (all when
// empty) at each M of `ms` on 1 and 2 threads, weights stored as `storage`; and the case "model":
// the matmuls of one stories110m forward (12 layers of qkv, wo, w13, w2 with their own weights,
// 340 MB fp32, then the classifier for M rows), so the weights stream from DRAM as in an engine
// step instead of staying in the L3 cache. us/call is per matmul call or per model pass.
int BenchMatmul(bk::Isa isa, int reps, const std::string& only, const std::vector<int64_t>& ms,
                bk::DType storage) {
  const double peak[3] = {0, FmaPeak(isa, 1, reps), FmaPeak(isa, 2, reps)};
  std::printf("FMA peak %s GFLOP/s: %.1f (1 thread), %.1f (2 threads)\n", bk::IsaName(isa), peak[1],
              peak[2]);
  std::printf("\n%-6s %5s %5s %5s %3s %4s %10s %9s %8s\n", "matmul", "N", "K", "store", "thr", "M",
              "us/call", "GFLOP/s", "%peak");
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 0.02f);
  auto pack = [&](int64_t n, int64_t k) {
    std::vector<float> w(static_cast<size_t>(n * k));
    for (float& v : w) v = dist(rng);
    const bk::MatrixPart part{w.data(), bk::DType::kF32, n};
    return bk::PackedMatrix::Pack(std::span<const bk::MatrixPart>(&part, 1), k, storage);
  };
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<float> x(static_cast<size_t>(max_m * 4096)), y(static_cast<size_t>(max_m * 32000));
  for (float& v : x) v = dist(rng);
  auto run = [&](const bk::PackedMatrix& w, int64_t m, bk::ThreadPool* pool) {
    bk::MatmulParams p;
    p.x = x.data();
    p.m = m;
    p.ldx = w.k();
    p.w = &w;
    p.y = y.data();
    p.ldy = w.n();
    bk::Matmul(isa, p, pool);
  };
  auto report = [&](const char* name, int64_t n, int64_t k, int threads, int64_t m, double t,
                    double flops) {
    std::printf("%-6s %5lld %5lld %5s %3d %4lld %10.1f %9.1f %7.1f%%\n", name,
                static_cast<long long>(n), static_cast<long long>(k),
                storage == bk::DType::kF32 ? "f32" : "bf16", threads, static_cast<long long>(m),
                t * 1e6, flops / t / 1e9, 100 * flops / t / 1e9 / peak[threads]);
    std::fflush(stdout);
  };
  for (const MatmulCase& c : kMatmulCases) {
    if (std::string(c.name).find(only) == std::string::npos) continue;
    bitroll::Result<bk::PackedMatrix> pm = pack(c.n, c.k);
    if (!pm.ok()) {
      std::fprintf(stderr, "%s\n", pm.status().ToString().c_str());
      return 1;
    }
    for (int threads : {1, 2}) {
      bk::ThreadPool pool(threads);
      Clock::threads = threads;
      for (int64_t m : ms) {
        const double t = TimePerCall([&] { run(*pm, m, &pool); }, reps);
        report(c.name, c.n, c.k, threads, m, t, 2.0 * m * c.n * c.k);
      }
    }
  }
  if (std::string("model").find(only) == std::string::npos) return 0;
  constexpr int kLayers = 12;
  std::vector<bk::PackedMatrix> layers;
  for (int l = 0; l < kLayers; ++l) {
    for (int i = 0; i < 4; ++i) {
      bitroll::Result<bk::PackedMatrix> pm = pack(kMatmulCases[i].n, kMatmulCases[i].k);
      if (!pm.ok()) {
        std::fprintf(stderr, "%s\n", pm.status().ToString().c_str());
        return 1;
      }
      layers.push_back(std::move(*pm));
    }
  }
  bitroll::Result<bk::PackedMatrix> cls = pack(kMatmulCases[4].n, kMatmulCases[4].k);
  if (!cls.ok()) return 1;
  double layer_flops_per_row = 0;
  for (int i = 0; i < 4; ++i) layer_flops_per_row += 2.0 * kMatmulCases[i].n * kMatmulCases[i].k;
  for (int threads : {1, 2}) {
    bk::ThreadPool pool(threads);
    Clock::threads = threads;
    for (int64_t m : ms) {
      // Prefill-sized calls take the logits of one row only, as the engine does.
      const int64_t cls_m = m > 64 ? 1 : m;
      const double t = TimePerCall(
          [&] {
            for (const bk::PackedMatrix& w : layers) run(w, m, &pool);
            run(*cls, cls_m, &pool);
          },
          reps, 0.0);
      report("model", 0, 0, threads, m, t,
             kLayers * layer_flops_per_row * m + 2.0 * cls_m * cls->n() * cls->k());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string isa_name = "auto";
  int reps = 5;
  bool quick = false;
  bool attention = false;
  bool kv_consecutive = false, kv_hugepages = false;
  int kv_layers = 1;
  std::string attention_only;
  bool matmul = false;
  std::string matmul_only;
  std::vector<int64_t> matmul_ms = {1, 2, 16, 32, 64, 128, 256, 512};
  bk::DType matmul_storage = bk::DType::kF32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--isa=", 0) == 0) {
      isa_name = a.substr(6);
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::atoi(a.c_str() + 7));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--kv-consecutive") {
      kv_consecutive = true;
    } else if (a == "--kv-hugepages") {
      kv_hugepages = true;
    } else if (a.rfind("--kv-layers=", 0) == 0) {
      kv_layers = std::max(1, std::atoi(a.c_str() + 12));
    } else if (a == "--attention") {
      attention = true;
    } else if (a.rfind("--attention=", 0) == 0) {
      attention = true;
      attention_only = a.substr(12);
    } else if (a == "--matmul") {
      matmul = true;
    } else if (a.rfind("--matmul=", 0) == 0) {
      matmul = true;
      matmul_only = a.substr(9);
    } else if (a.rfind("--m=", 0) == 0) {
      matmul_ms.clear();
      for (const std::string& m : bitroll::bench::SplitCommas(a.substr(4))) {
        matmul_ms.push_back(std::max<int64_t>(1, std::atoll(m.c_str())));
      }
    } else if (a == "--bf16") {
      matmul_storage = bk::DType::kBF16;
    } else if (a == "--clock=cpu") {
      Clock::cpu = true;
    } else if (a == "--clock=wall") {
      Clock::cpu = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--isa=auto|scalar|avx2|avx512] [--reps=N] [--quick] "
                   "[--clock=wall|cpu] [--attention[=CASE] [--kv-consecutive] [--kv-hugepages] "
                   "[--kv-layers=N]] [--matmul[=CASE] [--m=M,M,...] [--bf16]]\n",
                   argv[0]);
      return 2;
    }
  }
  bitroll::Result<bk::Isa> parsed = bk::ParseIsa(isa_name);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const bk::Isa isa = *parsed;
  const unsigned hw = std::thread::hardware_concurrency();
  std::printf("bench_kernels: isa=%s reps=%d (medians) clock=%s hardware threads=%u\n",
              bk::IsaName(isa), reps, Clock::cpu ? "cpu" : "wall", hw);
  if (attention) {
    return BenchAttention(isa, reps, attention_only, kv_consecutive, kv_hugepages, kv_layers);
  }
  if (matmul) return BenchMatmul(isa, reps, matmul_only, matmul_ms, matmul_storage);

  // Machine limits.
  double peak[3] = {0, 0, 0}, bw[3] = {0, 0, 0};
  std::printf("\n%-34s %12s %12s\n", "limit", "1 thread", "2 threads");
  for (bk::Isa i : {bk::Isa::kScalar, bk::Isa::kAvx2, bk::Isa::kAvx512}) {
    if (!bk::IsaSupported(i)) continue;
    const double p1 = FmaPeak(i, 1, reps), p2 = FmaPeak(i, 2, reps);
    if (i == isa) peak[1] = p1, peak[2] = p2;
    std::printf("FMA peak %-16s GFLOP/s %12.1f %12.1f\n", bk::IsaName(i), p1, p2);
  }
  if (bk::IsaSupported(bk::Isa::kAvx512)) {
    const bk::ZeroPages z = bitroll::bench::ReadBandwidthBuffer(int64_t{512} << 20);
    const auto* buf = reinterpret_cast<const float*>(z.data());
    const auto n = static_cast<int64_t>(z.size() / sizeof(float));
    if (buf != nullptr) {
      bw[1] = ReadBandwidth(1, reps, buf, n);
      bw[2] = ReadBandwidth(2, reps, buf, n);
    }
    std::printf("%-34s %12.1f %12.1f\n", "read bandwidth GB/s", bw[1], bw[2]);
  } else {
    std::printf("read bandwidth: needs AVX-512 in this bench; skipped\n");
  }
  for (int threads : {2, 3}) {
    bk::ThreadPool pool(threads);
    Clock::threads = threads;
    const std::function<void(int, int64_t)> empty = [](int, int64_t) {};
    const double t = TimePerCall([&] { pool.Run(threads, empty); }, reps);
    std::printf("ThreadPool(%d) empty Run(%d tasks)    %9.2f us\n", threads, threads, t * 1e6);
  }

  // Matmul on the stories110m shapes.
  const Shape shapes[] = {{"qkv   N=2304 K=768", 2304, 768},
                          {"w1|w3 N=4096 K=768", 4096, 768},
                          {"w2    N=768 K=2048", 768, 2048},
                          {"cls   N=32000 K=768", 32000, 768}};
  std::vector<int64_t> ms = {1, 8, 32, 64};
  if (quick) ms = {1, 32};
  std::printf("\n%-20s %5s %3s %4s %10s %9s %8s %9s %8s\n", "matmul", "store", "thr", "M",
              "us/call", "GFLOP/s", "%peak", "GB/s(W)", "%bw");
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 0.02f);
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    for (float& v : w) v = dist(rng);
    std::vector<float> x(static_cast<size_t>(64 * s.k)), y(static_cast<size_t>(64 * s.n));
    for (float& v : x) v = dist(rng);
    for (bk::DType storage : {bk::DType::kF32, bk::DType::kBF16}) {
      const bk::MatrixPart part{w.data(), bk::DType::kF32, s.n};
      bitroll::Result<bk::PackedMatrix> pm =
          bk::PackedMatrix::Pack(std::span<const bk::MatrixPart>(&part, 1), s.k, storage);
      if (!pm.ok()) {
        std::fprintf(stderr, "%s\n", pm.status().ToString().c_str());
        return 1;
      }
      for (int threads : {1, 2}) {
        bk::ThreadPool pool(threads);
        Clock::threads = threads;
        for (int64_t m : ms) {
          bk::MatmulParams p;
          p.x = x.data();
          p.m = m;
          p.ldx = s.k;
          p.w = &*pm;
          p.y = y.data();
          p.ldy = s.n;
          const double t = TimePerCall([&] { bk::Matmul(isa, p, &pool); }, reps);
          const double gflops = 2.0 * m * s.n * s.k / t / 1e9;
          const double gbs = static_cast<double>(pm->size_bytes()) / t / 1e9;
          std::printf("%-20s %5s %3d %4lld %10.1f %9.1f %7.1f%% %9.1f %7.1f%%\n", s.name,
                      storage == bk::DType::kF32 ? "f32" : "bf16", threads,
                      static_cast<long long>(m), t * 1e6, gflops,
                      peak[threads] > 0 ? 100 * gflops / peak[threads] : 0.0, gbs,
                      bw[threads] > 0 ? 100 * gbs / bw[threads] : 0.0);
        }
      }
    }
  }
  return 0;
}
