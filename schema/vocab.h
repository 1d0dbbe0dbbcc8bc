// schema/vocab.h: the values every module shares (issue 13, "one vocabulary").
//
// The engine produces them, the WAL stores them, the protocol carries them and the clients hand
// them to the trainer; each is defined here once, and every module uses this type (never a copy
// of its fields). The wire tables (schema/rollout.fbs) and the log tables (schema/wal.fbs) keep
// their own layout for byte compatibility; schema/wire_translate.h and schema/wal_translate.h are
// the only code that converts between them and these values.
//
// Dependency-free: the C++ standard library and schema/status.h only, so that every module
// (wal/, engine/, kernels/, sandbox/, rollout/ and the standalone C++ client) may include it.
//
// Enum numbering is stored (the WAL) and sent (the wire): append only, never renumber. The
// translators check every enumerator against its FlatBuffers mirror at compile time.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"

namespace bitroll {

// Sampling parameters, applied in this fixed order: temperature, top-k, top-p, min-p, then
// Gumbel-max over the survivors with Philox noise keyed on (seed, sample_index, position, id)
// (engine/sampler.h). On the wire and in the log `seed` sits beside the other four fields (its
// table slot never moved); here it is part of the value.
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax, ties to the lowest id)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
};

// The smallest positive temperature accepted. 0 means greedy; a temperature in (0, 1e-6) is
// refused with kInvalidArgument (ValidateSamplingParams below): logits / T overflows fp32 for
// ordinary logits (NaN logprobs), and such a distribution's logprobs are all about 0 or -inf, which
// no trainer can use. Pass 0 for greedy.
inline constexpr float kMinTemperature = 1e-6f;

// The one check of sampling parameters (the wire's ValidateSubmit, the engine's Add and `bitroll
// generate` call it): OK, or kInvalidArgument naming the first field out of range, with its value.
// temperature: finite, 0 or >= kMinTemperature; top_k >= 0; top_p in (0, 1]; min_p in [0, 1].
inline Status ValidateSamplingParams(const SamplingParams& p) {
  auto text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return std::string(buf);
  };
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return Status::InvalidArgument("temperature must be finite and >= 0, got " +
                                   text(p.temperature));
  }
  if (p.temperature > 0.0f && p.temperature < kMinTemperature) {
    // logits / T overflows fp32: every logprob would be NaN (0 is greedy).
    return Status::InvalidArgument("temperature must be 0 (greedy) or >= 1e-06, got " +
                                   text(p.temperature));
  }
  if (p.top_k < 0) return Status::InvalidArgument("top_k must be >= 0, got " + text(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Status::InvalidArgument("top_p must be in (0, 1], got " + text(p.top_p));
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return Status::InvalidArgument("min_p must be in [0, 1], got " + text(p.min_p));
  }
  return Status::Ok();
}

// Identifies the numerics: equality of results is promised within one fingerprint.
struct NumericsFingerprint {
  uint64_t weights_hash = 0;
  uint32_t kernel_version = 0;
  uint32_t attention_chunk = 0;  // S of the attention contract
  std::string backend;  // "cpu", "cpu-bf16" or "cuda" (ISA is not part of it: all CPU ISAs give
                        // equal bits; GPU models are, see engine/cuda/cuda_transformer.h)
};

// What a trajectory consumed. The engine fills the first four (engine_seconds shares each step's
// wall time among the sequences in that step, in proportion to the tokens each one processed);
// the coordinator adds queueing, the sandbox, the WAL and the price.
struct Cost {
  int64_t prefill_computed = 0;  // prompt tokens run through the model
  int64_t prefill_cached = 0;    // prompt tokens taken from the prefix cache
  int64_t decode_tokens = 0;
  double engine_seconds = 0.0;
  double queue_seconds = 0.0;
  double sandbox_seconds = 0.0;
  double sandbox_cpu_seconds = 0.0;
  int64_t wal_bytes = 0;
  double price_usd = 0.0;

  void Add(const Cost& o) {
    prefill_computed += o.prefill_computed;
    prefill_cached += o.prefill_cached;
    decode_tokens += o.decode_tokens;
    engine_seconds += o.engine_seconds;
    queue_seconds += o.queue_seconds;
    sandbox_seconds += o.sandbox_seconds;
    sandbox_cpu_seconds += o.sandbox_cpu_seconds;
    wal_bytes += o.wal_bytes;
    price_usd += o.price_usd;
  }
};

// The routing record of a mixture-of-experts trajectory (a request's return_routing): for every
// position that entered the model (the prompt, then every generated token but the last), per MoE
// layer, the top-k expert ids and their fp32 routing weights in slot order (engine/moe.h).
// Layout [positions][n_layers][k]. Empty for dense models and when not requested.
//
// On the wire and in the log (rollout.fbs / wal.fbs table Routing) ids take the smallest integer
// type that fits n_experts: one byte up to 256 experts, else two. Bytes per position:
// n_layers * k * (RoutingIdBytes(n_experts) + 4); e.g. Qwen3-30B-A3B (48 layers, top-8 of 128):
// 384 B of ids + 1,536 B of weights = 1,920 B (vLLM's int16 [tokens, layers, k] ids: 768 B,
// without weights).
struct RoutingRecord {
  int32_t n_layers = 0;
  int32_t k = 0;
  int32_t n_experts = 0;
  std::vector<uint16_t> expert_ids;  // n_experts <= 65535
  std::vector<float> weights;        // fp32 bits as the router computed them
  int64_t positions() const {
    return n_layers * k == 0 ? 0 : static_cast<int64_t>(expert_ids.size()) / (n_layers * k);
  }
  bool empty() const { return expert_ids.empty(); }
};

// Bytes of one expert id on the wire and in the log: 1 when n_experts <= 256, else 2.
constexpr int RoutingIdBytes(int32_t n_experts) {
  return n_experts <= 256 ? 1 : 2;
}

// Why a sequence stopped. Stored in the WAL (one byte) and sent on the wire.
enum class FinishReason : uint8_t {
  kNone = 0,      // still running
  kLength = 1,    // max_tokens reached or the model's context is full
  kStop = 2,      // a stop id or stop string was produced
  kEos = 3,       // EOS (or BOS under stop_at_bos) was sampled
  kAborted = 4,   // cancelled (Abort, a disconnect, Engine::Abort)
  kError = 5,     // see the accompanying error
  kToolCall = 6,  // the model's turn ended on a complete tool call (rollout/tool_detect.h); never
                  // produced by the engine itself
};

// Stable lower-case name: "none", "length", "stop", "eos", "aborted", "error", "tool_call".
constexpr const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
    case FinishReason::kToolCall:
      return "tool_call";
  }
  return "unknown";
}

// Sandbox tier of a tool (sandbox/sandbox.h, docs/design.md "Sandbox"). Stored in the WAL.
enum class ToolTier : uint8_t { kFunction = 0, kProcess = 1, kContainer = 2, kVm = 3 };

// Stable lower-case name: "function", "process", "container", "vm".
constexpr const char* ToolTierName(ToolTier t) {
  switch (t) {
    case ToolTier::kFunction:
      return "function";
    case ToolTier::kProcess:
      return "process";
    case ToolTier::kContainer:
      return "container";
    case ToolTier::kVm:
      return "vm";
  }
  return "unknown";
}

// Element type of a weight tensor (the model file, a streamed weight update's TensorFrame.dtype).
enum class DType : uint8_t { kF32, kF16, kBF16 };

// "f32", "f16" or "bf16": the names TensorFrame.dtype carries.
constexpr std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      break;
  }
  return "f32";
}

// The inverse of DTypeName; nullopt for any other string.
constexpr std::optional<DType> DTypeFromName(std::string_view s) {
  if (s == "f32") return DType::kF32;
  if (s == "f16") return DType::kF16;
  if (s == "bf16") return DType::kBF16;
  return std::nullopt;
}

// DTypeFromName with an error: kInvalidArgument "unknown dtype 'x' (f32, f16 or bf16)".
inline Result<DType> ParseDType(std::string_view s) {
  if (std::optional<DType> d = DTypeFromName(s)) return *d;
  return Status::InvalidArgument("unknown dtype '" + std::string(s) + "' (f32, f16 or bf16)");
}

// Bytes per element.
constexpr size_t DTypeSize(DType d) {
  return d == DType::kF32 ? 4 : 2;
}

}  // namespace bitroll
