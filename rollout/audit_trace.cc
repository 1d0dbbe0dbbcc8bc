// Per-layer checksums of one position (rollout/audit_trace.h).
#include "rollout/audit_trace.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "engine/cpu_engine.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/tokenizer.h"

namespace bitroll::rollout {

namespace {

uint64_t Fnv1a64(const float* data, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(float)); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

Result<LayerTrace> TraceLayers(const engine::EngineOptions& options, const TrajectoryRecord& record,
                               int32_t position, const TracePerturb& perturb) {
  if (options.device != "cpu") {
    return Status::InvalidArgument("--trace-layers traces the CPU forward pass (--device cpu)");
  }
  Result<engine::ModelWeights> w = engine::LoadModelWeights(options.model_path);
  if (!w.ok()) return w.status();
  engine::CpuEngineParts parts;
  Result<std::unique_ptr<engine::Tokenizer>> tok =
      engine::LoadTokenizerFor(options.model_path, options.tokenizer_path, w->config.vocab_size);
  if (tok.ok()) parts.tokenizer = std::move(tok).value();
  std::vector<int32_t> prompt = record.prompt_ids;
  if (prompt.empty()) {
    if (parts.tokenizer == nullptr) {
      return Status::Unavailable("the prompt is text and the model has no tokenizer");
    }
    BR_ASSIGN_OR_RETURN(prompt, parts.tokenizer->Encode(record.prompt_text, /*add_bos=*/true));
  }
  const auto total = static_cast<int64_t>(prompt.size() + record.ids.size());
  if (position < 0 || position >= total) {
    return Status::InvalidArgument("--trace-layers " + std::to_string(position) +
                                   ": the trajectory has positions [0, " + std::to_string(total) +
                                   ")");
  }
  LayerTrace out;
  out.position = position;
  parts.weights = std::make_shared<const engine::ModelWeights>(std::move(w).value());
  parts.options = options;
  parts.options.prefix_cache = false;  // every position is computed, none comes from a cache
  parts.options.kv_disk_dir.clear();
  parts.trace_position = position;
  parts.trace = [&out, &perturb](int32_t layer, const char* op, float* data, int64_t n) {
    if (perturb) perturb(layer, op, data, n);
    TraceLine t;
    t.layer = layer;
    t.op = op;
    t.n = n;
    t.hash = Fnv1a64(data, n);
    for (int64_t i = 0; i < n; ++i) t.sum += data[i];
    out.lines.push_back(std::move(t));
  };
  BR_ASSIGN_OR_RETURN(std::unique_ptr<engine::CpuEngine> e,
                      engine::CpuEngine::Create(std::move(parts)));
  out.weights_hash = e->info().fingerprint.weights_hash;
  // The tokens [0, position]: the prompt, then forced recorded ids; one sampled token when the
  // position lies inside the prompt (its row is computed all the same).
  engine::SequenceRequest q;
  q.id = 1;
  q.sample_index = record.sample_index;
  q.sampling = record.sampling;
  q.stop.stop_at_eos = q.stop.stop_at_bos = false;
  if (position < static_cast<int32_t>(prompt.size())) {
    q.prompt.assign(prompt.begin(), prompt.begin() + position + 1);
    q.stop.max_tokens = 1;
  } else {
    q.prompt = prompt;
    const int32_t k = position + 1 - static_cast<int32_t>(prompt.size());
    q.forced.assign(record.ids.begin(), record.ids.begin() + k);
    q.stop.max_tokens = k;
  }
  BR_RETURN_IF_ERROR(e->Add(std::move(q)));
  while (e->HasWork()) {
    Result<engine::StepResult> step = e->Step();
    if (!step.ok()) return step.status();
    for (const engine::SequenceOutput& o : step->finished) {
      if (o.finish == FinishReason::kError) return o.error;
    }
  }
  if (out.lines.empty()) return Status::Internal("--trace-layers: the position was never computed");
  return out;
}

Result<std::vector<Alternative>> TopAlternatives(const engine::EngineOptions& options,
                                                 const TrajectoryRecord& record, int32_t position,
                                                 int k) {
  std::vector<float> logits;
  auto grab = [&logits](int32_t, const char* op, float* data, int64_t n) {
    if (std::strcmp(op, "logits") == 0) logits.assign(data, data + n);
  };
  BR_RETURN_IF_ERROR(TraceLayers(options, record, position, grab).status());
  if (logits.empty()) return Status::Internal("no logits at position " + std::to_string(position));
  const double t = record.sampling.temperature > 0 ? record.sampling.temperature : 1.0;
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, x / t);
  double z = 0;
  for (float x : logits) z += std::exp(x / t - mx);
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t top = std::min<size_t>(static_cast<size_t>(std::max(k, 0)), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<Alternative> out;
  for (size_t i = 0; i < top; ++i) {
    out.push_back({idx[i], logits[idx[i]] / t - mx - std::log(z)});
  }
  return out;
}

std::string FormatTrace(const LayerTrace& t) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "# bitroll audit --trace-layers %d (weights %016" PRIx64 ")\n",
                t.position, t.weights_hash);
  std::string s = buf;
  for (const TraceLine& l : t.lines) {
    std::snprintf(buf, sizeof(buf), "%3d %-10s %7" PRId64 " %016" PRIx64 " %.9g\n", l.layer,
                  l.op.c_str(), l.n, l.hash, l.sum);
    s += buf;
  }
  return s;
}

}  // namespace bitroll::rollout
