// engine/routing.cc: per-sequence routing records (see the header).
#include "engine/routing.h"

#include <algorithm>
#include <cstring>

namespace bitroll::engine {

void RecordRoutes(Sequence* s, int32_t position, const int32_t* ids, const float* weights,
                  int32_t per_position) {
  const size_t at = static_cast<size_t>(position) * per_position;
  if (s->route_ids.size() < at + per_position) {
    s->route_ids.resize(at + per_position);
    s->route_weights.resize(at + per_position);
  }
  for (int32_t i = 0; i < per_position; ++i) {
    s->route_ids[at + i] = static_cast<uint16_t>(ids[i]);
  }
  std::memcpy(s->route_weights.data() + at, weights, per_position * sizeof(float));
  s->n_routed = std::max(s->n_routed, position + 1);
}

RoutingRecord TakeRoutes(Sequence* s, const ModelConfig& c, int64_t positions) {
  RoutingRecord r;
  r.n_layers = c.n_layers;
  r.k = c.n_experts_per_tok;
  r.n_experts = c.n_experts;
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(positions, s->n_routed));
  const size_t len = static_cast<size_t>(n * r.n_layers * r.k);
  r.expert_ids = std::move(s->route_ids);
  r.weights = std::move(s->route_weights);
  r.expert_ids.resize(len);
  r.weights.resize(len);
  return r;
}

}  // namespace bitroll::engine
