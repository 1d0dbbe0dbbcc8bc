// engine/loaders/hf.h: Hugging Face checkpoints (a directory with config.json and safetensors).
//
// Directory layout:
//   config.json                         LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
//                                       Qwen3MoeForCausalLM or Qwen2MoeForCausalLM
//   model.safetensors                   one shard, or
//   model.safetensors.index.json        {"weight_map": {tensor name: shard file name}} and the
//   model-0000i-of-0000N.safetensors    shards it names (plain file names inside the directory)
//   generation_config.json              optional: bos/eos ids when config.json lacks them
// Tensor names are transformers' (model.embed_tokens.weight,
// model.layers.N.self_attn.q_proj.weight,
// ..., model.norm.weight, lm_head.weight). dtypes F32, F16 and BF16 are loaded in place (mmap).
//
// Config mapping: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: num_attention_heads), vocab_size, max_position_embeddings (capped
// by HfLoadOptions::max_seq_len), rms_norm_eps (default 1e-6), rope_theta (default 10000),
// tie_word_embeddings (default false), bos/eos_token_id (an eos list uses its first id; default
// 1 / 2). RoPE is the NeoX half-split layout (transformers' rotate_half) on the weights as they
// are. Qwen2 has q/k/v biases. Qwen3 has QK-norm (self_attn.q_norm / k_norm, [head_dim]) and may
// set head_dim apart from hidden_size / num_attention_heads. rope_scaling with rope_type "llama3"
// (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings; engine/
// rope_scaling.h). MoE (engine/moe.h): num_experts, num_experts_per_tok, moe_intermediate_size,
// norm_topk_prob (default true on Qwen3-MoE, false on Qwen2-MoE), Qwen2-MoE's
// shared_expert_intermediate_size; tensors mlp.gate.weight (router), mlp.experts.E.{gate,up,
// down}_proj.weight, mlp.shared_expert.*, mlp.shared_expert_gate.weight. Other rope_scaling types,
// dense layers inside a MoE model (decoder_sparse_step != 1, mlp_only_layers), attention_bias on
// Llama / Qwen3, mlp_bias, head_dim other than hidden_size / num_attention_heads outside Qwen3,
// and hidden_act other than silu are kUnsupported. Sliding-window layers: sliding_window with
// layer_types (sliding_attention / full_attention) or sliding_window_pattern (Gemma 3), or alone
// for every layer (ignored when use_sliding_window is false; with max_window_layers and no
// layer_types, Qwen2's scheme, kUnsupported); a bad window, pattern or layer type
// is kInvalidArgument. Attention sinks (GPT-OSS): self_attn.sinks [num_attention_heads] per layer,
// present in layer 0 -> required in every layer.
//
// Thread-safety: LoadHuggingFace has no shared state; the result is immutable.
#pragma once

#include <cstdint>
#include <string>

#include "engine/model_weights.h"
#include "schema/status.h"

namespace bitroll::engine {

struct HfLoadOptions {
  // Caps ModelConfig::max_seq_len (max_position_embeddings is often 32K-128K, which makes the RoPE
  // tables large). 0 = use max_position_embeddings.
  int32_t max_seq_len = 0;
};

// Loads the checkpoint in directory `dir`. Errors:
//   kNotFound         no config.json / no safetensors file / a shard named by the index is missing
//   /
//                     a required tensor is missing (the message names it)
//   kUnsupported      another architecture (named), a dtype other than F32/F16/BF16, an
//                     unsupported config feature (named)
//   kCorruption       malformed config.json, index or safetensors header; the index names a tensor
//                     its shard lacks
//   kInvalidArgument  a tensor whose shape disagrees with config.json; a bad config value
//   kIoError          a file cannot be read or mapped
Result<ModelWeights> LoadHuggingFace(const std::string& dir, const HfLoadOptions& options = {});

}  // namespace bitroll::engine
