#include "engine/cpu_engine.h"
#include "engine/invariance_break.h"
#include "engine/model_loader.h"
#include "engine/routing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

namespace bitroll::engine {

namespace {

Result<kernels::AttentionKernel> ParseAttention(const std::string& s) {
  if (s == "auto") return kernels::AttentionKernel::kAuto;
  if (s == "single") return kernels::AttentionKernel::kSingle;
  if (s == "split") return kernels::AttentionKernel::kSplit;
  return Status::InvalidArgument("attention kernel '" + s + "': expected auto, single or split");
}

// Keeps the prefix-cache hash chains (and so the disk tier's files) of different numerics
// fingerprints apart. "cpu" is 0 and "cpu-bf16" 0xbf16, as before the backend seam.
uint64_t BackendSalt(const std::string& backend) {
  if (backend == "cpu") return 0;
  if (backend == "cpu-bf16") return 0xbf16ull;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : backend) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

constexpr int32_t kKvBlockTokens = 16;  // a multiple of the attention chunk S

// MemAvailable of /proc/meminfo in bytes; 0 when unreadable.
int64_t MemAvailableBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

}  // namespace

int64_t AutoKvCacheBytes(int64_t bytes_per_sequence, int64_t mem_available) {
  int64_t want = std::max<int64_t>(256ll << 20, 8 * bytes_per_sequence);
  if (mem_available > 0) want = std::min(want, mem_available / 10 * 4);
  return std::max(want, bytes_per_sequence);
}

Result<std::unique_ptr<CpuEngine>> CpuEngine::Create(CpuEngineParts parts) {
  const EngineOptions& o = parts.options;
  if (parts.weights == nullptr) return Status::InvalidArgument("engine: no weights");
  if (o.threads < 1 || o.threads > 1024) {
    return Status::InvalidArgument("engine: threads must be in [1, 1024], got " +
                                   std::to_string(o.threads));
  }
  if (o.max_step_tokens < 1 || o.max_running < 1 || o.max_prefill_chunk < 1) {
    return Status::InvalidArgument(
        "engine: max_step_tokens, max_running and max_prefill_chunk must be >= 1");
  }
  if (o.preempt_every_steps < 0 || o.kv_disk_bytes < 0) {
    return Status::InvalidArgument("engine: preempt_every_steps and kv_disk_bytes must be >= 0");
  }
  BR_ASSIGN_OR_RETURN(kernels::Isa isa, kernels::ParseIsa(o.isa));
  BR_ASSIGN_OR_RETURN(kernels::AttentionKernel attention, ParseAttention(o.attention));
  // Test only (engine/invariance_break.h): read once here, never on the hot path.
  BR_ASSIGN_OR_RETURN(MatmulFn broken_matmul, TestBreakMatmulFromEnv());
  std::unique_ptr<CpuEngine> e(new CpuEngine());
  e->opt_ = o;
  e->weight_version_ = o.weight_version;
  e->weight_storage_ = parts.weight_storage;
  e->pool_ = std::make_unique<kernels::ThreadPool>(o.threads);
  const ModelConfig& c = parts.weights->config;
  if (parts.tokenizer != nullptr && parts.tokenizer->vocab_size() != c.vocab_size) {
    return Status::InvalidArgument("tokenizer has " +
                                   std::to_string(parts.tokenizer->vocab_size()) +
                                   " tokens, model expects " + std::to_string(c.vocab_size));
  }
  e->tokenizer_ = std::move(parts.tokenizer);
  e->weights_ = parts.weights;
  e->info_.name = parts.weights->source;
  e->info_.vocab_size = c.vocab_size;
  e->info_.max_seq_len = c.max_seq_len;
  e->info_.bos_id = c.bos_id;
  e->info_.eos_id = c.eos_id;
  e->info_.fingerprint.weights_hash = parts.weights->weights_hash;
  e->info_.fingerprint.kernel_version = kernels::kKernelVersion;
  e->info_.fingerprint.attention_chunk = kernels::kAttentionChunk;
  if (o.kv_dtype != "f32" && o.kv_dtype != "bf16") {
    return Status::InvalidArgument("engine: kv_dtype '" + o.kv_dtype + "': expected f32 or bf16");
  }
  const kernels::DType kv_storage =
      o.kv_dtype == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
  if (parts.backend != nullptr && kv_storage != kernels::DType::kF32) {
    return Status::Unsupported("engine: a bf16 KV cache needs the CPU forward backend");
  }
  if (parts.backend != nullptr) {
    const ModelConfig& bc = parts.backend->config();
    if (bc.dim != c.dim || bc.n_layers != c.n_layers || bc.vocab_size != c.vocab_size ||
        bc.max_seq_len != c.max_seq_len || bc.n_kv_heads != c.n_kv_heads) {
      return Status::InvalidArgument(
          "engine: the forward backend's model differs from the weights");
    }
    if (c.has_sliding() || c.attn_sinks) {
      return Status::Unsupported(
          "engine: sliding-window layers and attention sinks run on the "
          "cpu device only");
    }
    e->backend_ = std::move(parts.backend);
  } else {
    TransformerOptions topt;
    topt.isa = isa;
    topt.attention = attention;
    topt.pool = e->pool_.get();
    topt.weight_storage = parts.weight_storage;
    topt.kv_storage = kv_storage;
    topt.matmul_override = parts.matmul_override != nullptr ? parts.matmul_override : broken_matmul;
    topt.expert_matmul_override = TestBreakExpertMatmulFromEnv();
    topt.test_break_window_chunk = TestBreakWindowChunkFromEnv();
    topt.test_break_sibling_tile = TestBreakSiblingTileFromEnv();
    topt.trace_position = parts.trace_position;
    topt.trace = std::move(parts.trace);
    BR_ASSIGN_OR_RETURN(e->backend_, Transformer::Create(std::move(parts.weights), topt));
  }
  e->info_.fingerprint.backend = e->backend_->fingerprint_backend();
  if (e->backend_->kv_store() != nullptr && !o.kv_disk_dir.empty()) {
    return Status::Unsupported("engine: the KV disk tier is not supported by the '" +
                               e->info_.fingerprint.backend + "' backend (K/V on the device)");
  }

  KvCacheOptions kv;
  kv.n_layers = c.n_layers;
  kv.n_kv_heads = c.n_kv_heads;
  kv.head_dim = c.head_dim();
  kv.block_size = kKvBlockTokens;
  kv.dtype = kv_storage;
  BR_ASSIGN_OR_RETURN(const SwaCache swa, ParseSwaCache(o.swa_cache, kv.block_size));
  // A hybrid model on the CPU backend keeps its sliding layers in their own pool (kv_cache.h).
  int32_t n_sliding = 0, widest = 0;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    n_sliding += c.window(l) > 0 ? 1 : 0;
    widest = std::max(widest, c.window(l));
  }
  const bool split = n_sliding > 0 && n_sliding < c.n_layers && e->backend_->kv_store() == nullptr;
  const int64_t per_seq = (c.max_seq_len + kv.block_size - 1) / kv.block_size;
  if (split) {
    kv.layer_sliding.resize(static_cast<size_t>(c.n_layers));
    for (int32_t l = 0; l < c.n_layers; ++l) kv.layer_sliding[l] = c.window(l) > 0 ? 1 : 0;
  }
  const int64_t full_bytes = KvCache::BlockBytes(kv, KvPool::kFull);
  const int64_t sliding_bytes = KvCache::BlockBytes(kv, KvPool::kSliding);
  const int64_t budget =
      o.kv_cache_bytes > 0
          ? o.kv_cache_bytes
          : AutoKvCacheBytes(per_seq * (full_bytes + sliding_bytes), MemAvailableBytes());
  kv.num_blocks = budget / (full_bytes + sliding_bytes);
  if (split) {
    // The budget by layer kind: the sliding pool holds the running sequences' windows and chunks
    // plus what the policy caches (full: a block per cached block; checkpoint: the windows at the
    // boundaries; recompute: nothing); the full pool gets the rest.
    const int64_t bs = kv.block_size;
    const int64_t window_blocks = (widest + bs - 1) / bs + 2;
    // A step writes at most max_step_tokens rows, and one sequence never holds more sliding
    // blocks than its block table (a context of max_seq_len).
    const int64_t step_blocks = (o.max_step_tokens + bs - 1) / bs;
    const int64_t running_need =
        int64_t{o.max_running} * window_blocks + step_blocks + window_blocks;
    const int64_t as_full = kv.num_blocks;  // the full policy: one sliding block per block
    int64_t cached = 0;
    if (swa.policy == SwaCachePolicy::kFull) cached = as_full;
    if (swa.policy == SwaCachePolicy::kCheckpoint) {
      cached = as_full * std::min<int64_t>(window_blocks * bs, swa.checkpoint) / swa.checkpoint;
    }
    const int64_t one_seq = std::min(window_blocks + step_blocks + 1, per_seq);
    // The running windows' reservation is capped at half the blocks of the full split (but never
    // below one sequence's need): max_running windows of a wide window can otherwise take a small
    // budget whole, and a policy that caches less sliding state would free no room for the full
    // layers. Past the cap, sequences wait for sliding blocks as they wait for full ones.
    const int64_t running = std::min(running_need, std::max(one_seq, as_full / 2));
    kv.num_sliding_blocks = std::min(as_full, running + cached);
    kv.num_blocks = (budget - kv.num_sliding_blocks * sliding_bytes) / full_bytes;
    if (kv.num_sliding_blocks < one_seq) {
      return Status::InvalidArgument("engine: kv_cache_bytes " + std::to_string(budget) +
                                     " leaves the sliding layers fewer blocks than one sequence "
                                     "needs (" +
                                     std::to_string(one_seq) + ")");
    }
  }
  if (kv.num_blocks < per_seq) {
    return Status::InvalidArgument("engine: kv_cache_bytes " + std::to_string(budget) +
                                   " holds fewer blocks than one full-context sequence needs (" +
                                   std::to_string(per_seq) + " blocks of " +
                                   std::to_string(full_bytes + sliding_bytes) + " bytes)");
  }
  BR_ASSIGN_OR_RETURN(e->cache_, KvCache::Create(kv));
  BR_RETURN_IF_ERROR(e->backend_->AttachKvCache(*e->cache_));
  e->cache_->set_store(e->backend_->kv_store());
  if (!o.kv_disk_dir.empty()) {
    KvDiskTierOptions dopt;
    dopt.dir = o.kv_disk_dir;
    // The cap is shared by layer kind as a block's bytes are (the sliding tier in a subfolder).
    dopt.max_bytes =
        split ? o.kv_disk_bytes / (full_bytes + sliding_bytes) * full_bytes : o.kv_disk_bytes;
    BR_ASSIGN_OR_RETURN(e->disk_, KvDiskTier::Open(dopt, kv.block_size, e->cache_->block_floats()));
    if (split) {
      dopt.dir = o.kv_disk_dir + "/sliding";
      dopt.max_bytes = o.kv_disk_bytes - dopt.max_bytes;
      BR_ASSIGN_OR_RETURN(
          e->sliding_disk_,
          KvDiskTier::Open(dopt, kv.block_size, e->cache_->block_floats(KvPool::kSliding)));
    }
  }
  PrefixCacheOptions popt;
  popt.enabled = o.prefix_cache;
  popt.seed = PrefixCache::ChainSeed(e->info_.fingerprint.weights_hash, kernels::kKernelVersion,
                                     kv.block_size) ^
              BackendSalt(e->info_.fingerprint.backend);
  popt.disk = e->disk_.get();
  popt.swa = swa;
  popt.swa_window = widest;
  popt.sliding_disk = e->sliding_disk_.get();
  e->prefix_ = std::make_unique<PrefixCache>(e->cache_.get(), popt);
  SchedulerOptions so;
  so.max_step_tokens = o.max_step_tokens;
  so.max_running = o.max_running;
  so.max_prefill_chunk = o.max_prefill_chunk;
  so.preempt_every_steps = o.preempt_every_steps;
  if (split) {
    so.swa_window = widest;
    so.swa_layers = n_sliding;
    so.test_late_rebuild = TestBreakLateRebuildFromEnv();
  }
  e->scheduler_ = std::make_unique<Scheduler>(so, e->cache_.get(), e->prefix_.get());
  for (int i = 0; i < o.threads; ++i) e->samplers_.push_back(std::make_unique<Sampler>(isa));
  return e;
}

Status CpuEngine::Add(SequenceRequest r) {
  const int32_t vocab = info_.vocab_size;
  if (r.prompt.empty())
    return Status::InvalidArgument("sequence " + std::to_string(r.id) + ": empty prompt");
  if (live_.count(r.id) != 0) {
    return Status::InvalidArgument("sequence " + std::to_string(r.id) + " is already live");
  }
  for (const auto* list : {&r.prompt, &r.forced}) {
    for (int32_t t : *list) {
      if (t < 0 || t >= vocab) {
        return Status::OutOfRange("sequence " + std::to_string(r.id) + ": token id " +
                                  std::to_string(t) + " outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")");
      }
    }
  }
  const int64_t known = static_cast<int64_t>(r.prompt.size() + r.forced.size());
  if (known > info_.max_seq_len) {
    return Status::OutOfRange("sequence " + std::to_string(r.id) + ": " + std::to_string(known) +
                              " tokens exceed the model context of " +
                              std::to_string(info_.max_seq_len));
  }
  if (r.stop.max_tokens < 1 || r.stop.max_tokens < static_cast<int64_t>(r.forced.size())) {
    return Status::InvalidArgument("sequence " + std::to_string(r.id) + ": max_tokens " +
                                   std::to_string(r.stop.max_tokens) +
                                   " must be >= 1 and >= the forced tokens");
  }
  BR_RETURN_IF_ERROR(ValidateSamplingParams(r.sampling));
  auto s = std::make_unique<Sequence>();
  s->tokens = r.prompt;
  s->tokens.insert(s->tokens.end(), r.forced.begin(), r.forced.end());
  s->n_prompt = static_cast<int32_t>(r.prompt.size());
  s->n_known = static_cast<int32_t>(s->tokens.size());
  s->arrival = arrivals_++;
  s->versions.push_back({0, weight_version_});
  if (!backend_->config().is_moe()) r.return_routing = false;  // dense: nothing to record
  s->req = std::move(r);
  const uint64_t id = s->req.id;
  live_.emplace(id, std::move(s));
  return Status::Ok();
}

Status CpuEngine::Abort(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return Status::NotFound("sequence " + std::to_string(id) + " is not live");
  Finish(it->second.get(), FinishReason::kAborted);
  return Status::Ok();
}

void CpuEngine::Finish(Sequence* s, FinishReason reason) {
  s->finish = reason;
  Scheduler::ReleaseBlocks(s, cache_.get());
  auto it = live_.find(s->req.id);
  done_.push_back(std::move(it->second));
  live_.erase(it);
}

void CpuEngine::Consume(const Pick& pick, StepResult* out) {
  Sequence* s = pick.seq;
  const int32_t next = pick.position + 1;
  const int32_t token = pick.forced ? s->tokens[next] : pick.result.token;
  const float logprob = pick.result.logprob;
  const bool sampled = !pick.forced;
  if (sampled) s->tokens.push_back(token);
  s->logprobs.push_back(logprob);
  if (s->versions.back().version != weight_version_) {
    s->versions.push_back({static_cast<int32_t>(s->logprobs.size()) - 1, weight_version_});
  }
  out->tokens.push_back({s->req.id, next, token, logprob, weight_version_});

  // Stop conditions, checked once every known token is scored.
  if (static_cast<int32_t>(s->logprobs.size()) < s->n_known - s->n_prompt) return;
  const StopParams& stop = s->req.stop;
  if (sampled) {
    if ((stop.stop_at_eos && token == info_.eos_id) ||
        (stop.stop_at_bos && token == info_.bos_id)) {
      Finish(s, FinishReason::kEos);
      return;
    }
    if (std::find(stop.stop_ids.begin(), stop.stop_ids.end(), token) != stop.stop_ids.end()) {
      Finish(s, FinishReason::kStop);
      return;
    }
  }
  if (s->generated() >= stop.max_tokens ||
      static_cast<int32_t>(s->tokens.size()) >= info_.max_seq_len) {
    Finish(s, FinishReason::kLength);
  }
}

Result<StepResult> CpuEngine::Step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepResult out;
  std::vector<Sequence*> live;
  live.reserve(live_.size());
  for (auto& [id, s] : live_) live.push_back(s.get());
  const std::vector<ScheduledChunk> chunks = scheduler_->Plan(live);

  rows_.clear();
  int64_t n_logits = 0;
  for (const ScheduledChunk& c : chunks) {
    for (int32_t p = c.begin; p < c.begin + c.count; ++p) {
      ForwardRow r;
      r.token = c.seq->tokens[p];
      r.position = p;
      r.block_table = c.seq->blocks.data();
      r.want_logits = c.seq->WantsLogits(p);
      r.sliding_table = c.seq->sblocks.empty() ? nullptr : c.seq->sblocks.data();
      r.write_full_kv = p >= c.seq->n_full_cached;
      n_logits += r.want_logits ? 1 : 0;
      rows_.push_back(r);
    }
  }
  if (!rows_.empty()) {
    logits_.resize(static_cast<size_t>(n_logits * info_.vocab_size));
    BR_RETURN_IF_ERROR(backend_->Forward(rows_, cache_.get(), logits_.data()));
    if (const int32_t* ids = backend_->route_ids(); ids != nullptr) {  // engine/routing.h
      const ModelConfig& mc = backend_->config();
      const int32_t per = mc.n_layers * mc.n_experts_per_tok;
      size_t row = 0;
      for (const ScheduledChunk& c : chunks) {
        for (int32_t p = c.begin; p < c.begin + c.count; ++p, ++row) {
          if (!c.seq->req.return_routing) continue;
          RecordRoutes(c.seq, p, ids + row * per, backend_->route_weights() + row * per, per);
        }
      }
    }
  }
  // Consume logits in row order; account costs.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t li = 0;
  size_t row = 0;
  for (const ScheduledChunk& c : chunks) {
    Sequence* s = c.seq;
    const int32_t end = c.begin + c.count;
    for (int32_t p = c.begin; p < end; ++p, ++row) {
      const bool decode = p >= s->n_known && p >= s->high_water && c.count == 1;
      if (decode) {
        ++s->cost.decode_tokens;
        ++totals_.decode_tokens;
      } else {
        ++s->cost.prefill_computed;
        ++totals_.prefill_tokens_computed;
      }
    }
    s->cost.engine_seconds += seconds * c.count / static_cast<double>(rows_.size());
    s->n_cached = end;
    s->high_water = std::max(s->high_water, end);
    scheduler_->Commit(s);
  }
  // Sampling and scoring are pure per row, so they run in parallel, one Sampler per worker; the
  // results are then applied in row order (a sequence may finish part-way through its chunk).
  picks_.clear();
  row = 0;
  for (const ScheduledChunk& c : chunks) {
    for (int32_t p = c.begin; p < c.begin + c.count; ++p, ++row) {
      if (!rows_[row].want_logits) continue;
      const bool forced = p + 1 < static_cast<int32_t>(c.seq->tokens.size());
      picks_.push_back({c.seq, p, logits_.data() + li * info_.vocab_size, forced, {}});
      ++li;
    }
  }
  const int32_t vocab = info_.vocab_size;
  pool_->Run(static_cast<int64_t>(picks_.size()), [&](int worker, int64_t i) {
    Pick& k = picks_[i];
    Sampler& sampler = *samplers_[worker];
    const SamplingParams& sp = k.seq->req.sampling;
    if (k.forced) {
      k.result.token = k.seq->tokens[k.position + 1];
      k.result.logprob = sampler.LogProb(k.logits, vocab, sp, k.result.token);
    } else {
      k.result = sampler.Sample(k.logits, vocab, sp, k.seq->req.sample_index, k.position + 1);
    }
  });
  for (const Pick& k : picks_) {
    if (k.seq->finish == FinishReason::kNone) Consume(k, &out);
  }
  out.tokens_processed = static_cast<int64_t>(rows_.size());
  ++totals_.steps;
  for (auto& s : done_) {
    SequenceOutput o;
    o.id = s->req.id;
    o.tokens.assign(s->tokens.begin() + s->n_prompt, s->tokens.end());
    o.logprobs = std::move(s->logprobs);
    o.tokens.resize(o.logprobs.size());  // an aborted sequence may hold unscored forced tokens
    o.finish = s->finish;
    o.error = s->error;
    o.cost = s->cost;
    o.versions = std::move(s->versions);
    if (s->req.return_routing) {
      o.routing = TakeRoutes(s.get(), backend_->config(),
                             s->n_prompt + static_cast<int64_t>(o.tokens.size()) - 1);
    }
    out.finished.push_back(std::move(o));
  }
  done_.clear();
  std::sort(out.finished.begin(), out.finished.end(),
            [](const SequenceOutput& a, const SequenceOutput& b) { return a.id < b.id; });
  std::stable_sort(out.tokens.begin(), out.tokens.end(),
                   [](const TokenEvent& a, const TokenEvent& b) { return a.id < b.id; });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

EngineStats CpuEngine::stats() const {
  EngineStats s = totals_;
  for (const auto& [id, q] : live_) (q->running ? s.running : s.waiting)++;
  s.kv_blocks_total = cache_->num_blocks();
  s.kv_blocks_free = cache_->free_blocks();
  s.kv_block_tokens = kKvBlockTokens;
  const SchedulerStats& ss = scheduler_->stats();
  s.prefill_tokens_cached = ss.prefill_tokens_cached;
  s.preemptions = ss.preemptions;
  s.cow_copies = ss.cow_copies;
  s.group_shared_tokens = ss.group_shared_tokens;
  s.swa_rebuilds = ss.swa_rebuilds;
  s.swa_recomputed_tokens = ss.swa_recomputed_tokens;
  const PrefixCacheStats& ps = prefix_->stats();
  s.kv_blocks_cached = prefix_->size();
  s.prefix_evictions = ps.evictions;
  s.disk_hit_blocks = ps.disk_hit_blocks;
  s.disk_spilled_blocks = ps.spilled;
  s.sliding_disk_hit_blocks = ps.sliding_disk_hit_blocks;
  if (disk_ != nullptr) {
    s.disk_corrupt_blocks = disk_->stats().corrupt;
    s.disk_bytes_full = disk_->stats().bytes;
  }
  if (sliding_disk_ != nullptr) {
    s.disk_corrupt_blocks += sliding_disk_->stats().corrupt;
    s.disk_bytes_sliding = sliding_disk_->stats().bytes;
  }
  KvMemoryByLayerKind(&s);
  return s;
}

void CpuEngine::KvMemoryByLayerKind(EngineStats* s) const {
  const ModelConfig& c = weights_->config;
  const KvCacheOptions& o = cache_->options();
  const int64_t per_layer_token =
      2 * int64_t{o.n_kv_heads} * o.head_dim * (o.dtype == kernels::DType::kBF16 ? 2 : 4);
  int64_t n_sliding = 0;
  for (int32_t l = 0; l < c.n_layers; ++l) n_sliding += c.window(l) > 0 ? 1 : 0;
  s->kv_bytes_per_token_full = per_layer_token * (c.n_layers - n_sliding);
  s->kv_bytes_per_token_sliding = per_layer_token * n_sliding;
  const int64_t used_tokens = (s->kv_blocks_total - s->kv_blocks_free) * kKvBlockTokens;
  s->kv_live_bytes_full = used_tokens * s->kv_bytes_per_token_full;
  s->kv_live_bytes_sliding = used_tokens * s->kv_bytes_per_token_sliding;
  const int64_t cached_tokens = prefix_->size() * kKvBlockTokens;
  s->prefix_cached_bytes_full = cached_tokens * s->kv_bytes_per_token_full;
  s->prefix_cached_bytes_sliding = cached_tokens * s->kv_bytes_per_token_sliding;
  if (cache_->split()) {
    s->kv_sliding_blocks_total = cache_->num_blocks(KvPool::kSliding);
    s->kv_sliding_blocks_free = cache_->free_blocks(KvPool::kSliding);
    s->kv_live_bytes_sliding = (s->kv_sliding_blocks_total - s->kv_sliding_blocks_free) *
                               kKvBlockTokens * s->kv_bytes_per_token_sliding;
    s->prefix_cached_bytes_sliding =
        prefix_->sliding_size() * kKvBlockTokens * s->kv_bytes_per_token_sliding;
  }
  const int64_t bs = kKvBlockTokens;
  for (int32_t l = 0; l < c.n_layers && n_sliding > 0; ++l) {
    const int32_t w = c.window(l);
    if (w <= 0) continue;
    for (const auto& [id, q] : live_) {
      if (!q->running || q->n_cached == 0) continue;
      const int64_t lo = std::max<int64_t>(0, q->n_cached - w);
      s->kv_window_bytes_sliding += ((q->n_cached - 1) / bs - lo / bs + 1) * bs * per_layer_token;
    }
  }
}

Status CpuEngine::CheckBlockAccounting() const {
  const int32_t bs = cache_->block_size();
  for (const auto& [id, s] : live_) {
    if (!s->running && (!s->blocks.empty() || !s->sblocks.empty())) {
      return Status::Internal("sequence " + std::to_string(id) +
                              " is not running but holds blocks");
    }
    if (static_cast<int64_t>(s->blocks.size()) * bs < s->n_cached) {
      return Status::Internal("sequence " + std::to_string(id) + ": table shorter than n_cached");
    }
    if (cache_->split() && s->running && s->sblocks.size() != s->blocks.size()) {
      return Status::Internal("sequence " + std::to_string(id) +
                              ": sliding table length differs from the block table");
    }
  }
  for (const KvPool pool : {KvPool::kFull, KvPool::kSliding}) {
    if (pool == KvPool::kSliding && !cache_->split()) break;
    const char* what = pool == KvPool::kFull ? "block " : "sliding block ";
    const int64_t n = cache_->num_blocks(pool);
    std::vector<int32_t> expect(static_cast<size_t>(n), 0);
    for (const auto& [id, s] : live_) {
      for (int32_t b : pool == KvPool::kFull ? s->blocks : s->sblocks) {
        if (pool == KvPool::kSliding && b == -1) continue;
        if (b < 0 || b >= n)
          return Status::Internal("sequence " + std::to_string(id) + ": bad " + what);
        ++expect[b];
      }
    }
    int64_t free = 0;
    for (int32_t b = 0; b < n; ++b) {
      const int32_t want = expect[b] + (prefix_->Holds(b, pool) ? 1 : 0);
      if (cache_->RefCount(b, pool) != want) {
        return Status::Internal(what + std::to_string(b) + ": reference count " +
                                std::to_string(cache_->RefCount(b, pool)) + ", held " +
                                std::to_string(want) + " times");
      }
      free += want == 0 ? 1 : 0;
    }
    if (free != cache_->free_blocks(pool)) {
      return Status::Internal(std::string("free list has ") +
                              std::to_string(cache_->free_blocks(pool)) + " " + what + "s, " +
                              std::to_string(free) + " have no reference");
    }
  }
  return Status::Ok();
}

Status CpuEngine::UpdateWeights(const std::string& path, uint64_t version) {
  BR_ASSIGN_OR_RETURN(ModelWeights w, LoadModelWeights(path));
  return InstallWeights(std::make_shared<const ModelWeights>(std::move(w)), version);
}

Status CpuEngine::InstallWeights(std::shared_ptr<const ModelWeights> w, uint64_t version) {
  if (w == nullptr) return Status::InvalidArgument("update weights: no weights");
  const ModelConfig& a = backend_->config();
  const ModelConfig& b = w->config;
  if (a.dim != b.dim || a.hidden_dim != b.hidden_dim || a.n_layers != b.n_layers ||
      a.n_heads != b.n_heads || a.n_kv_heads != b.n_kv_heads || a.vocab_size != b.vocab_size ||
      a.max_seq_len != b.max_seq_len) {
    return Status::InvalidArgument("update weights: " + w->source + " has a different shape");
  }
  const uint64_t hash = w->weights_hash;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<ForwardBackend> t, backend_->WithWeights(w));
  BR_RETURN_IF_ERROR(t->AttachKvCache(*cache_));
  // Cached K/V were computed by the old weights; running sequences are recomputed from their
  // tokens under the new ones.
  for (auto& [id, s] : live_) {
    Scheduler::ReleaseBlocks(s.get(), cache_.get());
    s->block_hashes.clear();  // chained from the old weights' seed
  }
  prefix_->Reset(PrefixCache::ChainSeed(hash, kernels::kKernelVersion, cache_->block_size()) ^
                 BackendSalt(info_.fingerprint.backend));
  // The new backend's K/V storage starts empty: every block was released above (the prefix
  // cache's Reset drops its entries), so nothing refers to the old storage any more.
  cache_->set_store(t->kv_store());
  backend_ = std::move(t);
  weights_ = std::move(w);
  weight_version_ = version;
  info_.fingerprint.weights_hash = hash;
  return Status::Ok();
}

}  // namespace bitroll::engine
