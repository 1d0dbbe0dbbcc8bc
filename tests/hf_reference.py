#!/usr/bin/python3
"""Reference forward pass for a Hugging Face Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE
checkpoint, in float64 numpy.

Independent of bitroll: it reads config.json and the safetensors files itself and follows
transformers' semantics (RMSNorm, half-split "rotate_half" RoPE, Llama 3 rope_scaling, GQA, q/k/v
biases, Qwen3 QK-norm and head_dim, SwiGLU, softmax top-k routing with norm_topk_prob, Qwen2-MoE's
sigmoid-gated shared expert, tied or separate lm_head). Prints one line per position t >= 1:
log p(tokens[t] | tokens[:t]), as a repr float.

  /usr/bin/python3 tests/hf_reference.py --model DIR --tokens 1,5,9,...

Sliding-window layers (transformers' sliding_window_causal mask: query t sees keys t-W+1..t) from
sliding_window with layer_types or sliding_window_pattern (Gemma 3: layer i full when
(i + 1) % P == 0), and GPT-OSS attention sinks (self_attn.sinks: a per-head logit appended to the
softmax, its probability dropped).

--break X computes a deliberately wrong model, for negative controls: no_qk_norm (skips QK-norm),
topk_plus_one (routes to k + 1 experts), no_rope_scaling (ignores rope_scaling), wrong_window
(window W + 1), no_sinks (ignores the sinks).
"""
import argparse
import json
import os
import struct

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            a = a.astype(np.float64)
        else:
            raise ValueError(dt)
        out[name] = a.reshape(info["shape"])
    return out


def load_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    w = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fn in files:
        w.update(load_safetensors(os.path.join(d, fn)))
    return w


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def llama3_inv_freq(inv_freq, rs):
    """transformers' _compute_llama3_parameters."""
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * np.pi / inv_freq
    f = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * f / factor + smooth * f
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, f)


def swiglu(h, w, p):
    gate = h @ w[p + "gate_proj.weight"].T
    up = h @ w[p + "up_proj.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "down_proj.weight"].T


def moe(cfg, w, p, h, broken):
    """Qwen3-MoE / Qwen2-MoE sparse block: softmax router, top-k, optional renormalisation."""
    k = cfg["num_experts_per_tok"] + (1 if broken == "topk_plus_one" else 0)
    arch = cfg["architectures"][0]
    norm = cfg.get("norm_topk_prob", arch == "Qwen3MoeForCausalLM")
    logits = h @ w[p + "mlp.gate.weight"].T  # [T, E]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:k]
        wt = probs[t, top]
        if norm:
            wt = wt / wt.sum()
        for e, g in zip(top, wt):
            out[t] += g * swiglu(h[t:t + 1], w, p + "mlp.experts.%d." % e)[0]
    if p + "mlp.shared_expert_gate.weight" in w:
        gate = h @ w[p + "mlp.shared_expert_gate.weight"].T  # [T, 1]
        out += 1.0 / (1.0 + np.exp(-gate)) * swiglu(h, w, p + "mlp.shared_expert.")
    return out


def layer_windows(cfg, n_layers):
    """Per layer: 0 (full attention) or the sliding window W."""
    if cfg.get("use_sliding_window") is False or not cfg.get("sliding_window"):
        return [0] * n_layers
    win = cfg["sliding_window"]
    if cfg.get("layer_types"):
        return [win if t == "sliding_attention" else 0 for t in cfg["layer_types"]]
    if cfg.get("sliding_window_pattern"):
        pat = cfg["sliding_window_pattern"]
        return [0 if (i + 1) % pat == 0 else win for i in range(n_layers)]
    return [win] * n_layers


def forward(cfg, w, tokens, broken=None):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    arch = cfg["architectures"][0]
    qwen = arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
    qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM") and broken != "no_qk_norm"
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]  # [T, d]
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs and broken != "no_rope_scaling":
        assert rs.get("rope_type", rs.get("type")) == "llama3", rs
        inv_freq = llama3_inv_freq(inv_freq, rs)
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)  # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    windows = layer_windows(cfg, cfg["num_hidden_layers"])
    for l in range(cfg["num_hidden_layers"]):
        mask = causal
        win = windows[l] + (1 if broken == "wrong_window" and windows[l] else 0)
        if win:
            mask = causal + np.tril(np.full((T, T), -np.inf), k=-win)
        sinks = w.get("model.layers.%d.self_attn.sinks" % l)
        if broken == "no_sinks":
            sinks = None
        p = "model.layers.%d." % l
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if qwen:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(T, nh, hd)
        k = k.reshape(T, nkv, hd)
        v = v.reshape(T, nkv, hd)
        if qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            if sinks is not None:  # GPT-OSS: the sink joins the softmax, then is dropped
                s = np.concatenate([s, np.full((T, 1), sinks[hh])], axis=-1)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att[:, hh, :] = s[:, :T] @ v[:, g, :]
        x = x + att.reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if "num_experts" in cfg:
            x = x + moe(cfg, w, p, h, broken)
        else:
            x = x + swiglu(h, w, p + "mlp.")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if cfg.get("tie_word_embeddings", False) or head is None:
        head = w["model.embed_tokens.weight"]
    logits = x @ head.T
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--break", dest="broken", default=None,
                   choices=["no_qk_norm", "topk_plus_one", "no_rope_scaling",
                            "wrong_window", "no_sinks"])
    a = p.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    tokens = [int(t) for t in a.tokens.split(",")]
    logp = forward(cfg, load_weights(a.model), tokens, a.broken)
    for t in range(1, len(tokens)):
        print(repr(float(logp[t - 1, tokens[t]])))


if __name__ == "__main__":
    main()
