#!/usr/bin/python3
"""Reference forward pass for a Hugging Face Llama / Qwen2 checkpoint, in float64 numpy.

Independent of bitroll: it reads config.json and the safetensors files itself and follows
transformers' semantics (RMSNorm, half-split "rotate_half" RoPE, GQA, q/k/v biases, SwiGLU,
tied or separate lm_head). Prints one line per position t >= 1: log p(tokens[t] | tokens[:t]),
as a repr float.

  /usr/bin/python3 tests/hf_reference.py --model DIR --tokens 1,5,9,...
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


def forward(cfg, w, tokens):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = d // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    qwen = cfg["architectures"][0] == "Qwen2ForCausalLM"
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]  # [T, d]
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)  # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(cfg["num_hidden_layers"]):
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
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            att[:, hh, :] = s @ v[:, g, :]
        x = x + att.reshape(T, d) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
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
    a = p.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    tokens = [int(t) for t in a.tokens.split(",")]
    logp = forward(cfg, load_weights(a.model), tokens)
    for t in range(1, len(tokens)):
        print(repr(float(logp[t - 1, tokens[t]])))


if __name__ == "__main__":
    main()
