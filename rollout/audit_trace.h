// rollout/audit_trace.h: per-layer checksums of one position's forward pass (`bitroll audit
// --trace-layers POS`, docs/audit.md "Locating a divergence").
//
// When two machines or two builds disagree on a trajectory, the audit names the first token that
// differs; TraceLayers names the first layer and operation. It re-runs the record's tokens up to
// absolute position POS (prompt first, then the record's ids, teacher-forced, prefix cache off)
// on the CPU Transformer and returns, in computation order, a checksum of every stage's fp32
// output at POS: the embedding, per layer attn_norm, qkv (after RoPE), attn (before wo),
// attn_out, resid_attn, ffn_norm, mlp_act, mlp_out, resid_mlp, then final_norm and logits
// (engine/transformer.h TransformerOptions::trace). Two traces of the same record diff line by
// line: the first line that differs is the first layer and op whose bits differ.
//
// Thread-safety: pure function of its arguments (it opens its own engine).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rollout/trajectory_record.h"
#include "schema/status.h"

namespace bitroll::engine {
struct EngineOptions;
}

namespace bitroll::rollout {

struct TraceLine {
  int32_t layer = 0;  // -1: the embedding; n_layers: final norm and logits
  std::string op;
  int64_t n = 0;      // floats in the stage's output
  uint64_t hash = 0;  // FNV-1a 64 of the output's bytes
  double sum = 0;     // the floats' sum in double, for people
};

struct LayerTrace {
  uint64_t weights_hash = 0;  // of the model traced
  int32_t position = 0;
  std::vector<TraceLine> lines;
};

// A test seam: called with each stage's output at the position before it is hashed; it may
// change the values (a deliberately perturbed kernel: later stages see the change).
using TracePerturb = std::function<void(int32_t layer, const char* op, float* data, int64_t n)>;

// Traces `record` at absolute position `position` (0 <= position < prompt + ids) with the model
// and engine flags of `options` (device cpu only). Errors: kInvalidArgument (a position outside
// the trajectory, a device other than cpu), the model loaders' and the engine's errors.
Result<LayerTrace> TraceLayers(const engine::EngineOptions& options, const TrajectoryRecord& record,
                               int32_t position, const TracePerturb& perturb = {});

struct Alternative {
  int32_t id = 0;
  double logprob = 0;  // log-softmax of logits / T (T = 0 scores at 1), in double: for people
};

// The k most likely tokens of the row at absolute position `position` (the row whose logits pick
// the token at position + 1), from its logits in a trace; ties to the lower id. Errors: those of
// TraceLayers.
Result<std::vector<Alternative>> TopAlternatives(const engine::EngineOptions& options,
                                                 const TrajectoryRecord& record, int32_t position,
                                                 int k);

// "layer op n hash sum" per line, a header line first (the position and weights hash).
std::string FormatTrace(const LayerTrace& t);

}  // namespace bitroll::rollout
