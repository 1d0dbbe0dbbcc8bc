#!/usr/bin/python3
"""Writes a small random Hugging Face checkpoint (config.json + safetensors) for tests.

The safetensors files are written by hand (8-byte header length, JSON header, raw little-endian
data), so only numpy is needed. Shapes follow transformers' LlamaForCausalLM / Qwen2ForCausalLM /
Qwen3ForCausalLM (QK-norm, --head-dim) / Qwen3MoeForCausalLM / Qwen2MoeForCausalLM (shared
expert); --llama3-scaling adds Llama 3's rope_scaling.

  /usr/bin/python3 scripts/make-hf-checkpoint.py --out DIR --arch qwen2 --dtype bf16 --shards 3
"""
import argparse
import json
import os
import struct

import numpy as np


def to_bf16_bits(a):
    """float32 array -> uint16 bfloat16 bits, rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def encode(a, dtype):
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    if dtype == "BF16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, float32 array). Data is laid out in list order, 8-byte aligned."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        b = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)  # pad so the data section starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (byte-level BPE)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
          list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_byte_tokenizer(path):
    """A byte-level BPE tokenizer.json with the 256 byte tokens (id = byte value), no merges."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}
    tok = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": level,
           "post_processor": None, "decoder": level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    with open(path, "w") as f:
        json.dump(tok, f, ensure_ascii=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe"],
                   default="llama")
    p.add_argument("--head-dim", type=int, default=0, help="qwen3*: explicit head_dim")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-hidden", type=int, default=48)
    p.add_argument("--shared-hidden", type=int, default=80, help="qwen2_moe shared expert")
    p.add_argument("--norm-topk", choices=["default", "true", "false"], default="default")
    p.add_argument("--llama3-scaling", action="store_true",
                   help="rope_scaling llama3: factor 8, low 1, high 4, original 64 positions")
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--max-pos", type=int, default=2048)
    p.add_argument("--theta", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", action="store_true",
                   help="also write a byte-level tokenizer.json (256 byte tokens; needs vocab >= 256)")
    a = p.parse_args()

    rng = np.random.default_rng(a.seed)
    hd = a.head_dim if a.head_dim > 0 else a.dim // a.heads
    d, kv, qd = a.dim, hd * a.kv_heads, hd * a.heads
    moe = a.arch in ("qwen3_moe", "qwen2_moe")

    def mat(out_f, in_f, gain=1.5):
        return (rng.standard_normal((out_f, in_f)) * gain / np.sqrt(in_f)).astype(np.float32)

    def vec(n, base, scale):
        return (base + scale * rng.standard_normal(n)).astype(np.float32)

    t = [("model.embed_tokens.weight", rng.standard_normal((a.vocab, d)).astype(np.float32))]
    for l in range(a.layers):
        b = "model.layers.%d." % l
        t.append((b + "input_layernorm.weight", vec(d, 1.0, 0.1)))
        t.append((b + "self_attn.q_proj.weight", mat(qd, d)))
        t.append((b + "self_attn.k_proj.weight", mat(kv, d)))
        t.append((b + "self_attn.v_proj.weight", mat(kv, d)))
        if a.arch in ("qwen2", "qwen2_moe"):
            t.append((b + "self_attn.q_proj.bias", vec(qd, 0.0, 0.3)))
            t.append((b + "self_attn.k_proj.bias", vec(kv, 0.0, 0.3)))
            t.append((b + "self_attn.v_proj.bias", vec(kv, 0.0, 0.3)))
        if a.arch in ("qwen3", "qwen3_moe"):
            t.append((b + "self_attn.q_norm.weight", vec(hd, 1.0, 0.3)))
            t.append((b + "self_attn.k_norm.weight", vec(hd, 1.0, 0.3)))
        t.append((b + "self_attn.o_proj.weight", mat(d, qd)))
        t.append((b + "post_attention_layernorm.weight", vec(d, 1.0, 0.1)))
        if moe:
            t.append((b + "mlp.gate.weight", mat(a.experts, d, 3.0)))
            for e in range(a.experts):
                x = b + "mlp.experts.%d." % e
                t.append((x + "gate_proj.weight", mat(a.moe_hidden, d)))
                t.append((x + "up_proj.weight", mat(a.moe_hidden, d)))
                t.append((x + "down_proj.weight", mat(d, a.moe_hidden)))
            if a.arch == "qwen2_moe" and a.shared_hidden > 0:
                x = b + "mlp.shared_expert."
                t.append((x + "gate_proj.weight", mat(a.shared_hidden, d)))
                t.append((x + "up_proj.weight", mat(a.shared_hidden, d)))
                t.append((x + "down_proj.weight", mat(d, a.shared_hidden)))
                t.append((b + "mlp.shared_expert_gate.weight", mat(1, d)))
        else:
            t.append((b + "mlp.gate_proj.weight", mat(a.hidden, d)))
            t.append((b + "mlp.up_proj.weight", mat(a.hidden, d)))
            t.append((b + "mlp.down_proj.weight", mat(d, a.hidden)))
    t.append(("model.norm.weight", vec(d, 1.0, 0.1)))
    if not a.tied:
        t.append(("lm_head.weight", mat(a.vocab, d, 3.0)))

    os.makedirs(a.out, exist_ok=True)
    dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[a.dtype]
    if a.shards == 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), t, dtype)
    else:
        per = (len(t) + a.shards - 1) // a.shards
        weight_map = {}
        for s in range(a.shards):
            name = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
            part = t[s * per:(s + 1) * per]
            write_safetensors(os.path.join(a.out, name), part, dtype)
            for n, _ in part:
                weight_map[n] = name
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    config = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                           "qwen2_moe": "Qwen2MoeForCausalLM"}[a.arch]],
        "model_type": a.arch,
        "hidden_size": d,
        "intermediate_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": a.eps,
        "rope_theta": a.theta,
        "tie_word_embeddings": a.tied,
        "hidden_act": "silu",
        "rope_scaling": None,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[a.dtype],
    }
    if a.head_dim > 0:
        config["head_dim"] = a.head_dim
    if a.llama3_scaling:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64}
    if a.arch in ("qwen3", "qwen3_moe"):
        config["attention_bias"] = False
    if moe:
        config.update({"num_experts": a.experts, "num_experts_per_tok": a.top_k,
                       "moe_intermediate_size": a.moe_hidden, "decoder_sparse_step": 1,
                       "mlp_only_layers": []})
        if a.norm_topk != "default":
            config["norm_topk_prob"] = a.norm_topk == "true"
        if a.arch == "qwen2_moe":
            config["shared_expert_intermediate_size"] = a.shared_hidden
    if a.arch == "llama":
        config.update({"bos_token_id": 1, "eos_token_id": 2})
    else:  # Qwen2 style: ids from generation_config.json, eos as a list
        with open(os.path.join(a.out, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 3, "eos_token_id": [4, 5]}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if a.tokenizer:
        write_byte_tokenizer(os.path.join(a.out, "tokenizer.json"))


if __name__ == "__main__":
    main()
