#!/usr/bin/env python3
"""Writes a random-weight Llama-shaped GGUF (F32) for the peer benchmark (scripts/bench-peer.sh).

The shape defaults to stories110m, the shape of bench_engine --attention-suite: dim 768, 12 layers,
12 heads (--kv-heads 3 for the suite's "gqa" model), FFN 2048, vocab 32000. The tokenizer
metadata (a 32,000-token Llama-2 SentencePiece vocabulary, which llama.cpp needs to load a model)
is copied from a source GGUF, by default ../shared/models/llama-2-tiny-random.gguf; the weights
are small normal values, so no kernel meets a denormal, a NaN or an infinity. Only the shape
matters to the benchmark: the values never change the work done.

    scripts/peer/make_gguf.py --out W/stories110m.gguf [--kv-heads 3] [--context 16448]
"""
import argparse
import array
import os
import random
import struct
import sys

GGUF_MAGIC = 0x46554747
# GGUF metadata value types (the spec's gguf_type).
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
          U64: "Q", I64: "q", F64: "d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s.decode("utf-8")

    def skip_value(self, t):
        if t in SCALAR:
            self.take(SCALAR[t])
        elif t == STR:
            self.string()
        elif t == ARR:
            et, n = self.take("I"), self.take("Q")
            if et in SCALAR:
                self.pos += n * struct.calcsize("<" + SCALAR[et])
            else:
                for _ in range(n):
                    self.skip_value(et)
        else:
            raise ValueError("unknown GGUF value type %d" % t)


def tokenizer_kvs(path):
    """The raw bytes of every tokenizer.* key-value pair of a GGUF file, and their count."""
    with open(path, "rb") as f:
        head = f.read(64 << 20)  # metadata sits at the front; 64 MiB holds any vocabulary
    r = Reader(head)
    if r.take("I") != GGUF_MAGIC:
        raise ValueError("%s: not a GGUF file" % path)
    if r.take("I") not in (2, 3):
        raise ValueError("%s: GGUF version 2 or 3 expected" % path)
    r.take("Q")  # tensors
    n_kv = r.take("Q")
    out, count = bytearray(), 0
    for _ in range(n_kv):
        start = r.pos
        key = r.string()
        t = r.take("I")
        r.skip_value(t)
        if key.startswith("tokenizer."):
            out += head[start:r.pos]
            count += 1
    if count == 0:
        raise ValueError("%s: no tokenizer.* metadata" % path)
    return bytes(out), count


def text(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return text(key) + struct.pack("<II", U32, v)


def kv_f32(key, v):
    return text(key) + struct.pack("<If", F32, v)


def kv_str(key, v):
    return text(key) + struct.pack("<I", STR) + text(v)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--context", type=int, default=16384 + 64)
    ap.add_argument("--tokenizer-from",
                    default=os.path.join(here, "..", "..", "..", "shared", "models",
                                         "llama-2-tiny-random.gguf"))
    a = ap.parse_args()
    for name in ("dim", "layers", "heads", "kv_heads", "hidden", "context"):
        if getattr(a, name) <= 0:
            ap.error("--%s must be > 0" % name.replace("_", "-"))
    if a.dim % a.heads or a.heads % a.kv_heads:
        ap.error("--dim must be a multiple of --heads, and --heads of --kv-heads")
    vocab = 32000
    tok, n_tok = tokenizer_kvs(a.tokenizer_from)
    head_dim = a.dim // a.heads
    kv_dim = head_dim * a.kv_heads
    arch = "llama"
    kvs = [kv_str("general.architecture", arch), kv_str("general.name", "bitroll-peer-random"),
           kv_u32(arch + ".context_length", a.context),
           kv_u32(arch + ".embedding_length", a.dim),
           kv_u32(arch + ".block_count", a.layers),
           kv_u32(arch + ".feed_forward_length", a.hidden),
           kv_u32(arch + ".attention.head_count", a.heads),
           kv_u32(arch + ".attention.head_count_kv", a.kv_heads),
           kv_u32(arch + ".rope.dimension_count", head_dim),
           kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5),
           kv_f32(arch + ".rope.freq_base", 10000.0),
           kv_u32("general.file_type", 0)]  # all F32
    # (name, ne) with ggml's ne: the innermost (contiguous) dimension first.
    tensors = [("token_embd.weight", (a.dim, vocab))]
    for l in range(a.layers):
        b = "blk.%d." % l
        tensors += [(b + "attn_norm.weight", (a.dim,)),
                    (b + "attn_q.weight", (a.dim, a.dim)),
                    (b + "attn_k.weight", (a.dim, kv_dim)),
                    (b + "attn_v.weight", (a.dim, kv_dim)),
                    (b + "attn_output.weight", (a.dim, a.dim)),
                    (b + "ffn_norm.weight", (a.dim,)),
                    (b + "ffn_gate.weight", (a.dim, a.hidden)),
                    (b + "ffn_up.weight", (a.dim, a.hidden)),
                    (b + "ffn_down.weight", (a.hidden, a.dim))]
    tensors += [("output_norm.weight", (a.dim,)), ("output.weight", (a.dim, vocab))]

    align = 32
    infos, offset = bytearray(), 0
    for name, ne in tensors:
        n = 1
        for d in ne:
            n *= d
        infos += text(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        infos += struct.pack("<IQ", 0, offset)  # GGML_TYPE_F32, offset in the data section
        offset += (n * 4 + align - 1) // align * align
    header = struct.pack("<IIQQ", GGUF_MAGIC, 3, len(tensors), len(kvs) + n_tok)
    meta = header + b"".join(kvs) + tok + bytes(infos)
    meta += b"\0" * (-len(meta) % align)

    # One pool of 2^20 normal(0, 0.02) values, each tensor a window into it that starts at a
    # different place (weights near 0.02 keep every activation finite through 12 layers).
    rng = random.Random(1)
    pool = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(1 << 20)))
    ones = array.array("f", [1.0]) * max(a.dim, a.hidden)
    tmp = a.out + ".tmp"
    try:
        write(tmp, meta, tensors, pool, ones, align)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, a.out)
    print("wrote %s (%d tensors, %.0f MB)" % (a.out, len(tensors), os.path.getsize(a.out) / 1e6))


def write(tmp, meta, tensors, pool, ones, align):
    with open(tmp, "wb") as f:
        f.write(meta)
        for i, (name, ne) in enumerate(tensors):
            n = 1
            for d in ne:
                n *= d
            if name.endswith("norm.weight"):
                f.write(ones[:n].tobytes())
            else:
                start = (i * 7919) % len(pool)
                left = n
                while left > 0:
                    take = min(left, len(pool) - start)
                    f.write(pool[start:start + take].tobytes())
                    left -= take
                    start = 0
            f.write(b"\0" * (-(n * 4) % align))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, struct.error) as e:
        sys.exit("make_gguf: %s" % e)
