// engine/engine.h: the engine's public face. An Engine owns one model replica: its KV cache, its
// scheduler and its sampler. A caller adds sequences, calls Step() in a loop and collects tokens
// and finished sequences.
//
// Invariance contract (docs/design.md "The invariance contract"): a sequence's token ids and fp32
// logprob bits are a pure function of (weights, prompt, forced tokens, sampling params,
// sample_index). They never depend on what else is in the engine, on batch size or position,
// prefill chunking, prefix-cache hits, thread count, attention kernel choice or the order of Add()
// calls.
//
// Thread-safety: an Engine is NOT thread-safe. One owner thread calls every method.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "schema/status.h"
#include "schema/vocab.h"

namespace bitroll::engine {

// SamplingParams, FinishReason, Cost and NumericsFingerprint: schema/vocab.h.

struct StopParams {
  int32_t max_tokens = 256;       // generated tokens (forced ones count) before kLength
  std::vector<int32_t> stop_ids;  // finishing on one of these includes it in the output
  bool stop_at_eos = true;        // the model's EOS id stops
  bool stop_at_bos = true;        // llama2.c convention: sampling BOS stops (BOS is not emitted)
};

// RoutingRecord (schema/vocab.h): what SequenceRequest::return_routing returns.
using ::bitroll::RoutingRecord;

struct SequenceRequest {
  uint64_t id = 0;              // chosen by the caller; unique among live sequences
  std::vector<int32_t> prompt;  // token ids; non-empty; each < vocab_size
  std::vector<int32_t> forced;  // teacher-forced continuation: appended as if sampled and
                                // scored (re-scoring, resume after a crash)
  uint32_t sample_index = 0;    // index within its group; keys the sampling noise
  SamplingParams sampling;
  StopParams stop;
  int32_t priority = 0;   // higher runs first when the engine is full
  uint64_t group_id = 0;  // samples of one group share the prompt's KV blocks
  // Return the RoutingRecord (MoE models; ignored for dense ones). Prefix-cache hits then cover
  // only positions this sequence has routed itself (its prompt is computed once), so every
  // position has its routes; the bits are unchanged.
  bool return_routing = false;
};

struct SequenceOutput {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // forced tokens, then sampled ones
  std::vector<float> logprobs;  // one per token: log p(token) under the temperature-scaled
                                // full distribution (temperature 0 scores at temperature 1)
  FinishReason finish = FinishReason::kNone;
  Status error;
  Cost cost;  // the engine fills prefill_computed, prefill_cached, decode_tokens, engine_seconds
  // The weight version that produced each token span: span i covers tokens
  // [versions[i].begin, versions[i+1].begin). One span unless weights changed mid-sequence.
  struct VersionSpan {
    int32_t begin = 0;
    uint64_t version = 0;
  };
  std::vector<VersionSpan> versions;
  RoutingRecord routing;  // when requested, MoE models only
};

// One token produced by a step, for streaming.
struct TokenEvent {
  uint64_t id = 0;
  int32_t position = 0;  // absolute position of the token in its sequence
  int32_t token = 0;
  float logprob = 0.0f;
  uint64_t weight_version = 0;
};

struct StepResult {
  std::vector<TokenEvent> tokens;        // new tokens, in sequence-id order
  std::vector<SequenceOutput> finished;  // sequences that finished in this step
  int64_t tokens_processed = 0;          // prefill + decode tokens run through the model
  double seconds = 0.0;
};

// The KV budget of EngineOptions::kv_cache_bytes = 0, for a model whose full-context sequence
// needs `bytes_per_sequence`, on a machine with `mem_available` bytes available (MemAvailable;
// 0: unknown, no cap): room for 8 such sequences, at least 256 MiB, at most 40% of
// mem_available, and never less than one sequence. The pool is reserved, not touched: pages are
// used as sequences need them.
int64_t AutoKvCacheBytes(int64_t bytes_per_sequence, int64_t mem_available);

struct ModelInfo {
  std::string name;
  int32_t vocab_size = 0;
  int32_t max_seq_len = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  NumericsFingerprint fingerprint;
};

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_block_tokens = 0;  // tokens per KV block: capacity = kv_blocks_total x this
  int64_t prefill_tokens_computed = 0;
  int64_t prefill_tokens_cached = 0;
  int64_t decode_tokens = 0;
  int64_t steps = 0;
  // KV cache and scheduler (engine/prefix_cache.h, engine/scheduler.h).
  int64_t kv_blocks_cached = 0;     // blocks named by the prefix cache (some may also be in use)
  int64_t prefix_evictions = 0;     // unreferenced cached blocks freed for reuse
  int64_t preemptions = 0;          // sequences whose blocks were released to make room
  int64_t cow_copies = 0;           // shared blocks copied before a write
  int64_t group_shared_tokens = 0;  // cached tokens taken from a running group sibling
  int64_t disk_hit_blocks = 0;      // prefix blocks loaded back from the disk tier
  int64_t disk_spilled_blocks = 0;  // evicted blocks written to the disk tier
  int64_t disk_corrupt_blocks = 0;  // disk blocks that failed verification (treated as misses)
  // KV memory per layer kind (full-attention layers / sliding-window layers; the sliding figures
  // are 0 for a model without sliding layers). bytes_per_token: K and V of one token summed over
  // the layers of that kind. live: bytes those layers hold in the blocks now in use (sequences and
  // prefix cache); on a hybrid model the sliding layers have their own pool and hold only the
  // blocks some window still reads, plus what the SWA policy caches. window: bytes the sliding
  // layers of the running sequences need (the blocks overlapping each sequence's last W
  // positions).
  int64_t kv_bytes_per_token_full = 0;
  int64_t kv_bytes_per_token_sliding = 0;
  int64_t kv_live_bytes_full = 0;
  int64_t kv_live_bytes_sliding = 0;
  int64_t kv_window_bytes_sliding = 0;
  // The sliding pool of a hybrid model (0 without one): blocks, free blocks.
  int64_t kv_sliding_blocks_total = 0;
  int64_t kv_sliding_blocks_free = 0;
  // Prefix cache by layer kind (memory tier): bytes its entries keep; per cached token, divide by
  // kv_blocks_cached x kv_block_tokens.
  int64_t prefix_cached_bytes_full = 0;
  int64_t prefix_cached_bytes_sliding = 0;
  // SWA policies: hits whose sliding state resumed before the hit's end, and the tokens they ran
  // again (docs/design.md "SWA prefix-cache policies").
  int64_t swa_rebuilds = 0;
  int64_t swa_recomputed_tokens = 0;
  int64_t sliding_disk_hit_blocks = 0;  // sliding blocks loaded back from the disk tier
  // The disk tier's files by layer kind (the sliding layers' blocks have a tier of their own).
  int64_t disk_bytes_full = 0;
  int64_t disk_bytes_sliding = 0;
};

class Tokenizer;      // engine/tokenizer.h
struct ModelWeights;  // engine/model_weights.h

struct EngineOptions {
  std::string model_path;      // llama2.c .bin, GGUF file, or Hugging Face directory (detected)
  std::string tokenizer_path;  // empty: tokenizer.bin or tok512.bin beside the model
  // Where the forward pass runs: "cpu" (default) or "cuda" (weights and the KV cache on the GPU;
  // a different numerics fingerprint). OpenEngine: kInvalidArgument for any other value,
  // kUnsupported "this build has no CUDA", kUnavailable "no CUDA device: ..." without a GPU.
  std::string device = "cpu";
  int32_t threads = 1;       // kernel threads; never changes a bit
  std::string isa = "auto";  // "auto" | "scalar" | "avx2" | "avx512"; never changes a bit
  std::string attention =
      "auto";  // "auto" (chosen by load) | "single" | "split"; never changes a bit
  // KV memory budget; sets the number of blocks. 0 (the default): AutoKvCacheBytes, sized from
  // the model and the machine, so that a long-context model runs with no flag.
  int64_t kv_cache_bytes = 0;
  // The KV cache's element type: "f32" (default) or "bf16" (CPU only: K/V rounded to bf16 when
  // written, half the KV memory and the K/V bytes attention reads; a different numerics
  // fingerprint, backend suffix "-kvbf16"). kInvalidArgument for other values; kUnsupported with
  // a device backend.
  std::string kv_dtype = "f32";
  int32_t max_step_tokens = 512;  // token budget of one step (prefill chunks + decodes)
  int32_t max_running = 256;      // sequences decoding at once
  uint64_t weight_version = 0;    // recorded on every token this engine produces
  // Prefix cache and GRPO sharing: full KV blocks are reused across sequences by a hash chain of
  // their tokens, and group siblings share the prompt's blocks (copy-on-write). Never changes a
  // bit; false recomputes everything (the reference the tests compare against).
  bool prefix_cache = true;
  std::string kv_disk_dir;            // non-empty: evicted prefix blocks spill to files here
  int64_t kv_disk_bytes = 1ll << 30;  // size cap of the disk tier (LRU files deleted above it)
  int32_t max_prefill_chunk = 256;    // prefill rows per sequence before others get a turn
  int32_t preempt_every_steps = 0;    // test hook: preempt one running sequence every k steps
  // Sliding-window (SWA) layers' prefix-cache policy (docs/design.md "SWA prefix-cache
  // policies"): "full" (a cached prefix keeps its sliding blocks), "checkpoint:P" (only the window
  // at every P-token boundary, P a multiple of the 16-token KV block; a hit recomputes the gap) or
  // "recompute" (none; a hit rebuilds the sliding state). Never changes a bit; ignored by models
  // without sliding layers. kInvalidArgument for other values.
  std::string swa_cache = "full";
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelInfo& info() const = 0;
  // Queues a sequence. Errors: kInvalidArgument (empty prompt, duplicate id, bad params),
  // kOutOfRange (token id outside the vocabulary, prompt longer than the context).
  virtual Status Add(SequenceRequest request) = 0;
  // Finishes a live sequence with kAborted; it is reported by the next Step(). kNotFound if
  // unknown.
  virtual Status Abort(uint64_t id) = 0;
  // Runs one scheduler step. A Status error means the engine itself failed, not one sequence.
  virtual Result<StepResult> Step() = 0;
  virtual bool HasWork() const = 0;
  virtual EngineStats stats() const = 0;
  // The model's tokenizer, or nullptr when the engine has none (test doubles).
  virtual const Tokenizer* tokenizer() const = 0;
  // Loads new weights (same shapes) from `path` under `version`. Takes effect at the next Step();
  // running sequences continue, and their later tokens record the new version.
  virtual Status UpdateWeights(const std::string& path, uint64_t version) = 0;
  // Installs weights already in memory (a streamed or broadcast update, engine/weight_update.h)
  // under `version`, with the rules of UpdateWeights. Errors: kInvalidArgument (other shapes),
  // backend errors.
  virtual Status InstallWeights(std::shared_ptr<const ModelWeights> weights, uint64_t version) = 0;
  // The weights now served (the base of a streamed update); nullptr for engines without weights
  // (test doubles).
  virtual std::shared_ptr<const ModelWeights> weights() const = 0;
};

// Opens the model named by options.model_path (format detected) on options.device.
// Errors: kNotFound, kCorruption, kUnsupported, kInvalidArgument (see the loaders); for device
// "cuda" also kUnsupported (a build without CUDA) and kUnavailable (no usable CUDA device).
Result<std::unique_ptr<Engine>> OpenEngine(const EngineOptions& options);

}  // namespace bitroll::engine
