"""Model files as (name, array) pairs a trainer would send: llama2.c checkpoints and safetensors.

For Client.update_weights_tensors and bitroll.nccl.broadcast_weights_nccl. Names are those of the
file's own format (docs/weights.md); bf16 tensors come as (uint16 bits, "bf16").
Needs only numpy.
"""

import glob
import json
import os

import numpy as np

from .errors import BitrollError


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):  # round to nearest even (finite inputs)
    u = f.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def load_llama2c(path):
    """[(name, float32 array)] of a legacy llama2.c checkpoint, in the served order, and its
    (vocab size, shared classifier)."""
    raw = np.fromfile(path, dtype=np.uint8)
    dim, hidden, layers, heads, kv_heads, vocab, seq = np.frombuffer(raw[:28], np.int32)
    shared = vocab > 0
    vocab = abs(int(vocab))
    kv_dim = dim // heads * kv_heads
    f = np.frombuffer(raw[28:], np.float32)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = f[pos:pos + n].reshape(shape)
        pos += n
        return a

    emb = take(vocab, dim)
    per_layer = {}
    for key, shape in (("attention_norm", (dim,)), ("attention.wq", (dim, dim)),
                       ("attention.wk", (kv_dim, dim)), ("attention.wv", (kv_dim, dim)),
                       ("attention.wo", (dim, dim)), ("ffn_norm", (dim,)),
                       ("feed_forward.w1", (hidden, dim)), ("feed_forward.w2", (dim, hidden)),
                       ("feed_forward.w3", (hidden, dim))):
        per_layer[key] = [take(*shape) for _ in range(layers)]
    norm = take(dim)
    pos += 2 * seq * (dim // heads // 2)  # RoPE tables: not weights
    out = [("tok_embeddings.weight", emb)]
    for i in range(layers):
        for key in per_layer:
            out.append((f"layers.{i}.{key}.weight", per_layer[key][i]))
    out.append(("norm.weight", norm))
    if not shared:
        out.append(("output.weight", take(vocab, dim)))
    return out, vocab


def load_safetensors(path):
    """[(name, array or (uint16 bits, 'bf16'))] of a .safetensors file or a directory of them."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) \
        else [path]
    if not files:
        raise BitrollError("not_found", f"no .safetensors file in {path}")
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = []
    for fn in files:
        raw = np.memmap(fn, dtype=np.uint8, mode="r")
        n = int(np.frombuffer(raw[:8], np.uint64)[0])
        header = json.loads(bytes(raw[8:8 + n]))
        for name, h in header.items():
            if name == "__metadata__" or name.endswith("rotary_emb.inv_freq"):
                continue
            if h["dtype"] not in kinds:
                raise BitrollError("invalid_argument", f"{name}: dtype {h['dtype']}")
            b, e = h["data_offsets"]
            a = np.frombuffer(raw[8 + n + b:8 + n + e], kinds[h["dtype"]]).reshape(h["shape"])
            out.append((name, (a, "bf16") if h["dtype"] == "BF16" else a))
    return out
