// engine/routing.h: per-sequence routing records of mixture-of-experts models (internal to
// engine/; the record itself is engine.h's RoutingRecord).
//
// The engine copies, after each Forward, the routes of the rows of sequences that asked for them
// (SequenceRequest::return_routing) into the sequence at their positions; a recomputed position
// (preemption, resume) is overwritten with the same bits, as routing is a pure function of the
// sequence's tokens (engine/moe.h). Scheduler::Attach lets a prefix hit cover only positions
// [0, n_routed) of such a sequence, so the record has no holes.
//
// Thread-safety: none; the engine's owner thread.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "engine/model_weights.h"
#include "engine/sequence.h"

namespace bitroll::engine {

// Stores the `per_position` = n_layers * k ids and weights of `position` into `s`.
// REQUIRES: position <= s->n_routed (positions arrive in order); ids in [0, 65535].
void RecordRoutes(Sequence* s, int32_t position, const int32_t* ids, const float* weights,
                  int32_t per_position);

// The record of positions [0, min(positions, s->n_routed)) of `s` under model config `c`; moves
// the sequence's buffers out.
RoutingRecord TakeRoutes(Sequence* s, const ModelConfig& c, int64_t positions);

}  // namespace bitroll::engine
