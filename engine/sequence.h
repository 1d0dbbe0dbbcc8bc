// engine/sequence.h: the engine's per-sequence state (internal to engine/).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace bitroll::engine {

struct Sequence {
  SequenceRequest req;
  std::vector<int32_t> tokens;  // prompt, then forced, then sampled tokens
  std::vector<float> logprobs;  // one per token after the prompt that has been scored
  int32_t n_prompt = 0;
  int32_t n_known = 0;          // prompt + forced: tokens not sampled by this engine
  std::vector<int32_t> blocks;  // KV block table, position order
  int32_t n_cached = 0;         // positions [0, n_cached) have K/V in the cache
  // A split KV cache (sliding pool, kv_cache.h): the sliding block table, as long as `blocks`;
  // -1 for blocks no sliding window of a future row reads (released) or not held.
  std::vector<int32_t> sblocks;
  // Positions [0, n_full_cached) have full-layer K/V (>= n_cached): rows below it rebuild
  // sliding state and leave the full layers' blocks unwritten (scheduler.h).
  int32_t n_full_cached = 0;
  // Sliding blocks wholly at or after this position hold exact K/V (a rebuild that started
  // without the window before it makes the first positions inexact, never read by a real row).
  int32_t swa_exact_from = 0;
  int32_t high_water = 0;  // the largest n_cached ever reached (recompute detection)
  uint64_t arrival = 0;    // admission order, for fairness among equal priorities
  bool running = false;    // holds KV blocks
  // Prefix cache: chain hashes of full blocks (a pure function of tokens, kept across
  // preemption) and how many of this sequence's full blocks were offered to the cache since it
  // last got its blocks.
  std::vector<uint64_t> block_hashes;
  int32_t n_committed = 0;
  FinishReason finish = FinishReason::kNone;
  Status error;
  Cost cost;
  std::vector<SequenceOutput::VersionSpan> versions;
  // Routing records (req.return_routing on a MoE model, engine/routing.h): positions
  // [0, n_routed) have their routes, [n_layers][k] per position.
  std::vector<uint16_t> route_ids;
  std::vector<float> route_weights;
  int32_t n_routed = 0;

  // Rows still to run through the model before the next token can be chosen.
  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - n_cached; }
  int32_t generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  // The first position whose row must still run because it produces logits (the last prompt
  // token, or the first forced token not yet scored): a prefix hit may cover at most this many.
  int32_t FirstLogitsRow() const { return n_prompt - 1 + static_cast<int32_t>(logprobs.size()); }
  // True when the row at `position` must produce logits.
  bool WantsLogits(int32_t position) const {
    const int32_t next = position + 1;
    if (next < n_prompt) return false;
    if (next < static_cast<int32_t>(tokens.size())) {
      return next - n_prompt >= static_cast<int32_t>(logprobs.size());  // a forced token to score
    }
    return true;  // choose the next token
  }
};

}  // namespace bitroll::engine
