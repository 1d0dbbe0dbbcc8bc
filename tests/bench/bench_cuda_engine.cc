// Whole-model decode benchmark of the CUDA backend (engine/cuda/cuda_transformer.h), run by
// scripts/device-check.sh (never by ctest):
//   bench_cuda_engine [--shape=qwen0.5b-like] [--batches=1,16,64,256] [--context=128]
//                     [--steps=32] [--threads=N]
//
// The model: a random-weight model of the named engine/make_model.h shape (default
// "qwen0.5b-like": 494M parameters, dim 896, 24 layers, 14 query / 2 KV heads, vocab 151936),
// built in memory as bf16 tensors (uniform in +-0.02, a fixed seed), tied embeddings. No file.
//
// For each batch size B, two figures:
//   forward  : the backend alone. B sequences are prefilled to --context tokens, then --steps
//              decode forwards of B rows (each row wants logits, copied back to the host) are
//              timed: tok/s = B * steps / seconds.
//   engine   : the whole engine (CpuEngine: scheduler, prefix cache, host sampling of the logits
//              with --threads workers). B greedy requests with --context-token prompts; only
//              steps whose rows are all decode rows are timed.
// Prints a table, then "SUMMARY engine: ..." (the line scripts/device-check.sh collects).
// Exit status: 0 ok, 1 no usable device or an error.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu_engine.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/kv_cache.h"
#include "engine/make_model.h"
#include "kernels/cpu/math.h"

namespace {

using namespace bitroll;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string shape = "qwen0.5b-like";
  std::vector<int> batches = {1, 16, 64, 256};
  int context = 128;
  int steps = 32;
  int threads = 0;  // 0: hardware concurrency, at most 16
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string p = std::string("--") + name + "=";
      return s.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    if (const char* v = value("shape")) {
      a->shape = v;
    } else if (const char* v = value("batches")) {
      a->batches.clear();
      std::stringstream in(v);
      for (std::string item; std::getline(in, item, ',');) a->batches.push_back(std::stoi(item));
    } else if (const char* v = value("context")) {
      a->context = std::atoi(v);
    } else if (const char* v = value("steps")) {
      a->steps = std::atoi(v);
    } else if (const char* v = value("threads")) {
      a->threads = std::atoi(v);
    } else {
      std::fprintf(stderr, "bench_cuda_engine: unknown argument %s\n", argv[i]);
      return false;
    }
  }
  return !a->batches.empty() && a->context >= 1 && a->steps >= 1;
}

// A random bf16 model of `shape` in memory (tied embeddings, RMSNorm weights 1).
std::shared_ptr<const engine::ModelWeights> RandomModel(const engine::ModelShape& shape) {
  auto w = std::make_shared<engine::ModelWeights>();
  engine::ModelConfig& c = w->config;
  c.dim = shape.dim;
  c.hidden_dim = shape.hidden_dim;
  c.n_layers = shape.n_layers;
  c.n_heads = shape.n_heads;
  c.n_kv_heads = shape.n_kv_heads;
  c.vocab_size = shape.vocab_size;
  c.max_seq_len = shape.max_seq_len;
  const int64_t dim = c.dim, kv = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  const int64_t per_layer = 2 * dim * dim + 2 * kv * dim + 3 * hidden * dim;
  const int64_t total = vocab * dim + c.n_layers * per_layer;
  auto bf16 = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(total));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < total; ++i) {  // splitmix64 -> uniform in [-0.02, 0.02)
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    (*bf16)[static_cast<size_t>(i)] = kernels::F32ToBf16((u * 2.0f - 1.0f) * 0.02f);
  }
  auto ones = std::make_shared<std::vector<float>>(static_cast<size_t>(dim), 1.0f);
  int64_t at = 0;
  auto take = [&](std::vector<int64_t> shape_) {
    engine::Tensor t;
    t.data = bf16->data() + at;
    t.dtype = kernels::DType::kBF16;
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    at += n;
    t.shape = std::move(shape_);
    return t;
  };
  engine::Tensor norm;
  norm.data = ones->data();
  norm.dtype = kernels::DType::kF32;
  norm.shape = {dim};
  w->token_embedding = take({vocab, dim});
  for (int32_t l = 0; l < c.n_layers; ++l) {
    engine::LayerWeights lw;
    lw.attn_norm = norm;
    lw.ffn_norm = norm;
    lw.wq = take({dim, dim});
    lw.wk = take({kv, dim});
    lw.wv = take({kv, dim});
    lw.wo = take({dim, dim});
    lw.w1 = take({hidden, dim});
    lw.w2 = take({dim, hidden});
    lw.w3 = take({hidden, dim});
    w->layers.push_back(std::move(lw));
  }
  w->final_norm = norm;
  w->classifier = w->token_embedding;
  w->source = "random:" + shape.name;
  w->storage = std::make_shared<
      std::pair<std::shared_ptr<std::vector<uint16_t>>, std::shared_ptr<std::vector<float>>>>(bf16,
                                                                                              ones);
  return w;
}

struct Figures {
  double forward_ms = 0, forward_tok_s = 0, engine_ms = 0, engine_tok_s = 0;
};

// The backend alone: prefill B sequences, then time decode forwards.
Status ForwardOnly(engine::cuda::CudaTransformer* t, engine::KvCache* cache, int batch,
                   const Args& a, std::mt19937* rng, Figures* f) {
  const engine::ModelConfig& c = t->config();
  const int32_t bs = cache->block_size();
  const int32_t len = a.context + a.steps + 2;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (auto& tb : tables) {
    for (int32_t b = 0; b < (len + bs - 1) / bs; ++b) {
      BR_ASSIGN_OR_RETURN(int32_t id, cache->Allocate());
      tb.push_back(id);
    }
  }
  std::uniform_int_distribution<int32_t> tok(3, c.vocab_size - 1);
  std::vector<float> logits;
  std::vector<engine::ForwardRow> rows;
  auto flush = [&]() -> Status {
    int64_t m = 0;
    for (const auto& r : rows) m += r.want_logits ? 1 : 0;
    logits.resize(static_cast<size_t>(std::max<int64_t>(m, 1) * c.vocab_size));
    Status s = t->Forward(rows, cache, logits.data());
    rows.clear();
    return s;
  };
  for (int s = 0; s < batch; ++s) {  // prefill, up to 2048 rows per forward
    for (int32_t p = 0; p < a.context; ++p) {
      rows.push_back({tok(*rng), p, tables[static_cast<size_t>(s)].data(), p == a.context - 1});
      if (rows.size() == 2048) BR_RETURN_IF_ERROR(flush());
    }
  }
  if (!rows.empty()) BR_RETURN_IF_ERROR(flush());
  auto decode = [&](int32_t pos) -> Status {
    for (int s = 0; s < batch; ++s) {
      rows.push_back({tok(*rng), pos, tables[static_cast<size_t>(s)].data(), true});
    }
    return flush();
  };
  BR_RETURN_IF_ERROR(decode(a.context));  // warm-up (scratch growth)
  const auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i) BR_RETURN_IF_ERROR(decode(a.context + 1 + i));
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  f->forward_ms = 1e3 * sec / a.steps;
  f->forward_tok_s = static_cast<double>(batch) * a.steps / sec;
  for (auto& tb : tables) {
    for (int32_t id : tb) cache->Release(id);
  }
  return Status::Ok();
}

// The whole engine: greedy requests, timing the all-decode steps.
Status WholeEngine(std::shared_ptr<const engine::ModelWeights> w, int batch, const Args& a,
                   int threads, std::mt19937* rng, Figures* f) {
  engine::CpuEngineParts parts;
  parts.weights = w;
  parts.options.device = "cuda";
  parts.options.threads = threads;
  parts.options.max_running = std::max(batch, 1);
  parts.options.max_step_tokens = 2048;
  parts.options.max_prefill_chunk = 2048;
  engine::KvCacheOptions kvo;
  kvo.n_layers = w->config.n_layers;
  kvo.n_kv_heads = w->config.n_kv_heads;
  kvo.head_dim = w->config.head_dim();
  kvo.num_blocks = 1;
  const int64_t block = engine::KvCache::BlockBytes(kvo);
  const int64_t per_seq = (a.context + a.steps + 8 + 15) / 16 + 1;
  parts.options.kv_cache_bytes =
      std::max<int64_t>(block * per_seq * batch, block * ((w->config.max_seq_len + 15) / 16));
  BR_ASSIGN_OR_RETURN(parts.backend, engine::cuda::CudaTransformer::Create(w, {}));
  BR_ASSIGN_OR_RETURN(std::unique_ptr<engine::CpuEngine> e,
                      engine::CpuEngine::Create(std::move(parts)));
  std::uniform_int_distribution<int32_t> tok(3, w->config.vocab_size - 1);
  for (int s = 0; s < batch; ++s) {
    engine::SequenceRequest r;
    r.id = static_cast<uint64_t>(s);
    for (int32_t p = 0; p < a.context; ++p) r.prompt.push_back(tok(*rng));
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = a.steps + 4;
    r.stop.stop_at_eos = false;
    r.stop.stop_at_bos = false;
    BR_RETURN_IF_ERROR(e->Add(std::move(r)));
  }
  double sec = 0;
  int64_t tokens = 0, timed_steps = 0;
  bool warm = false;
  while (e->HasWork()) {
    const auto t0 = Clock::now();
    BR_ASSIGN_OR_RETURN(engine::StepResult step, e->Step());
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool all_decode = step.tokens_processed == batch &&
                            static_cast<int64_t>(step.tokens.size()) == batch &&
                            step.finished.empty();
    if (all_decode && warm) {
      sec += dt;
      tokens += batch;
      ++timed_steps;
    }
    warm = warm || all_decode;
  }
  if (timed_steps == 0) return Status::Internal("no all-decode step to time");
  f->engine_ms = 1e3 * sec / static_cast<double>(timed_steps);
  f->engine_tok_s = static_cast<double>(tokens) / sec;
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 1;
  const Status dev = engine::cuda::CudaDeviceStatus(0);
  if (!dev.ok()) {
    std::printf("bench_cuda_engine: %s\nSUMMARY engine: NOT RUN (%s)\n", dev.ToString().c_str(),
                dev.message().c_str());
    return 1;
  }
  Result<engine::ModelShape> shape = engine::NamedShape(a.shape);
  if (!shape.ok()) {
    std::printf("bench_cuda_engine: %s\n", shape.status().ToString().c_str());
    return 1;
  }
  const int threads =
      a.threads > 0 ? a.threads
                    : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  const auto t_build = Clock::now();
  std::shared_ptr<const engine::ModelWeights> w = RandomModel(*shape);
  const engine::ModelConfig& c = w->config;
  auto fail = [](const Status& s) {
    std::printf("bench_cuda_engine: %s\nSUMMARY engine: FAILED (%s)\n", s.ToString().c_str(),
                s.message().c_str());
    return 1;
  };
  Result<std::unique_ptr<engine::cuda::CudaTransformer>> t =
      engine::cuda::CudaTransformer::Create(w, {});
  if (!t.ok()) return fail(t.status());
  const int max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  engine::KvCacheOptions ko;
  ko.n_layers = c.n_layers;
  ko.n_kv_heads = c.n_kv_heads;
  ko.head_dim = c.head_dim();
  ko.block_size = 16;
  ko.num_blocks = int64_t{max_batch} * ((a.context + a.steps + 2 + 15) / 16);
  Result<std::unique_ptr<engine::KvCache>> cache = engine::KvCache::Create(ko);
  if (!cache.ok()) return fail(cache.status());
  if (Status s = (*t)->AttachKvCache(**cache); !s.ok()) return fail(s);
  (*cache)->set_store((*t)->kv_store());
  std::printf(
      "model %s: dim %d hidden %d layers %d heads %d/%d vocab %d; %.1f M parameters, "
      "set up in %.1f s; device %.2f GiB; context %d, %d timed steps, %d sampling threads\n",
      shape->name.c_str(), c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
      (static_cast<double>(c.vocab_size) * c.dim +
       static_cast<double>(c.n_layers) *
           (2.0 * c.dim * c.dim + 2.0 * c.kv_dim() * c.dim + 3.0 * c.hidden_dim * c.dim)) /
          1e6,
      std::chrono::duration<double>(Clock::now() - t_build).count(),
      static_cast<double>((*t)->device_bytes()) / (1 << 30), a.context, a.steps, threads);
  std::printf("%6s %14s %14s %14s %14s\n", "batch", "forward ms", "forward tok/s", "engine ms",
              "engine tok/s");
  std::mt19937 rng(1);
  std::string summary = "SUMMARY engine: " + shape->name + " decode tok/s (forward | engine)";
  for (int b : a.batches) {
    Figures f;
    if (Status s = ForwardOnly(t->get(), cache->get(), b, a, &rng, &f); !s.ok()) return fail(s);
    if (Status s = WholeEngine(w, b, a, threads, &rng, &f); !s.ok()) return fail(s);
    std::printf("%6d %14.3f %14.1f %14.3f %14.1f\n", b, f.forward_ms, f.forward_tok_s, f.engine_ms,
                f.engine_tok_s);
    std::fflush(stdout);
    char buf[96];
    std::snprintf(buf, sizeof(buf), "; B=%d %.0f | %.0f", b, f.forward_tok_s, f.engine_tok_s);
    summary += buf;
  }
  std::printf("%s\n", summary.c_str());
  return 0;
}
