"""bitroll's CPU kernels as PyTorch autograd functions.

Every op has two forwards and one backward:
  float32 tensors  -> the engine's kernel (bitroll_kernels_ext): the engine's bits.
  float64 tensors  -> the same function in plain PyTorch math (the readable reference; gradcheck
                      runs here, so it checks the backward against this forward's numerical
                      derivative).
  backward         -> hand-written PyTorch math on the saved inputs, in the inputs' dtype.
All inputs of one call must share one dtype (float32 or float64) and live on the CPU; anything
else raises TypeError, a bad shape ValueError.

Ops (shapes: rows are tokens, packed):
  linear(x [.., k], weight [n, k], bias [n] or None) -> [.., n]     one fma chain per output
  rms_norm(x [.., d], weight [d], eps) -> [.., d]
  rope(x [rows, heads, head_dim], positions [rows], theta, interleaved=True, tables=None)
      tables: rope_tables(...)'s (cos, sin), the engine's (Llama 3 rope scaling)
  swiglu(gate [.., h], up [.., h]) -> [.., h]                        silu(gate) * up
  attention(q [rows, H, hd], k [rows, KVH, hd], v [rows, KVH, hd], cu_seqlens [B+1], scale)
      causal attention within each packed sequence (rows cu[b]..cu[b+1]-1 at positions 0..len-1),
      the engine's chunked order (prefill == decode)
  log_softmax(logits [.., V], temperature) -> [.., V]                the sampler's scoring
"""

import numpy as np
import torch

from ._ext import ext


def set_num_threads(n):
    """Threads for the kernels (default 1). Never changes a bit."""
    ext.set_num_threads(int(n))


def num_threads():
    return ext.num_threads()


def _check(name, *tensors):
    """The common dtype of the tensors (float32 or float64); TypeError otherwise."""
    dtypes = {t.dtype for t in tensors if t is not None}
    for t in tensors:
        if t is not None and (not isinstance(t, torch.Tensor) or t.device.type != "cpu"):
            raise TypeError(f"{name}: inputs must be CPU tensors")
    if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
        raise TypeError(f"{name}: inputs must all be float32 (bitroll's kernels) or all float64 "
                        f"(reference), got {sorted(str(d) for d in dtypes)}")
    return next(iter(dtypes))


def _np(t):
    return t.detach().contiguous().numpy()


def _run(fn, *args):
    try:
        return torch.from_numpy(fn(*args))
    except TypeError as e:  # pybind11 overload mismatch: a shape/dtype problem
        raise ValueError(str(e)) from e


# ---- linear --------------------------------------------------------------------------------

class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        dtype = _check("linear", x, weight, bias)
        if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
            raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} "
                             "do not match ([.., k] and [n, k])")
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        x2 = x.reshape(-1, x.shape[-1])
        if dtype == torch.float32:
            y = _run(ext.linear, _np(x2), _np(weight), None if bias is None else _np(bias))
        else:
            y = x2 @ weight.t()
            if bias is not None:
                y = y + bias
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g2 = g.reshape(-1, w.shape[0])
        x2 = x.reshape(-1, w.shape[1])
        if g.dtype == torch.float32:
            # The same products through bitroll's matmul (y = a @ b^T): Debian's PyTorch uses the
            # generic reference BLAS, which is several times slower. Not bitwise anything.
            mm = lambda a, b: torch.from_numpy(ext.linear(_np(a), _np(b), None))  # noqa: E731
        else:
            mm = lambda a, b: a @ b.t()  # noqa: E731
        gx = mm(g2, w.t()).reshape(x.shape) if ctx.needs_input_grad[0] else None
        gw = mm(g2.t(), x2.t()) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def linear(x, weight, bias=None):
    return _Linear.apply(x, weight, bias)


# ---- RMSNorm -------------------------------------------------------------------------------

class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        dtype = _check("rms_norm", x, weight)
        if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
            raise ValueError("rms_norm: weight must be [d] with d = x.shape[-1]")
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        x2 = x.reshape(-1, x.shape[-1])
        if dtype == torch.float32:
            y = _run(ext.rms_norm, _np(x2), _np(weight), float(eps))
        else:
            inv = 1.0 / torch.sqrt((x2 * x2).mean(-1, keepdim=True) + eps)
            y = weight * (x2 * inv)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        d = x.shape[-1]
        x2, g2 = x.reshape(-1, d), g.reshape(-1, d)
        inv = 1.0 / torch.sqrt((x2 * x2).mean(-1, keepdim=True) + ctx.eps)
        gh = g2 * w
        gx = inv * gh - x2 * inv ** 3 * (gh * x2).sum(-1, keepdim=True) / d
        gw = (g2 * x2 * inv).sum(0)
        return gx.reshape(x.shape), gw, None


def rms_norm(x, weight, eps=1e-5):
    return _RmsNorm.apply(x, weight, eps)


# ---- RoPE ----------------------------------------------------------------------------------

def _rope_tables(positions, head_dim, theta, dtype):
    """cos, sin [rows, head_dim / 2] by kernels::RopeTable's formula (in double)."""
    i = torch.arange(head_dim // 2, dtype=torch.float32)
    freq = 1.0 / torch.pow(torch.tensor(float(theta), dtype=torch.float64),
                           (2 * i / head_dim).double()).float()
    val = positions.float()[:, None] * freq[None, :]
    return torch.cos(val.double()).to(dtype), torch.sin(val.double()).to(dtype)


def _pairs(x, interleaved):
    """(x0, x1) views of the rotated pairs, and a function joining them back."""
    hd = x.shape[-1]
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return x0, x1, lambda a, b: torch.stack((a, b), -1).reshape(x.shape)
    return x[..., :hd // 2], x[..., hd // 2:], lambda a, b: torch.cat((a, b), -1)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, theta, interleaved, tables):
        dtype = _check("rope", x)
        if x.dim() != 3 or x.shape[-1] % 2 or positions.shape != (x.shape[0],):
            raise ValueError("rope: x must be [rows, heads, head_dim] (head_dim even) and "
                             "positions [rows]")
        if positions.dtype not in (torch.int32, torch.int64) or (positions < 0).any():
            raise ValueError("rope: positions must be non-negative integers")
        ctx.save_for_backward(positions)
        ctx.theta, ctx.interleaved, ctx.tables = theta, interleaved, tables
        if tables is not None and (tables[0].shape != tables[1].shape or tables[0].dim() != 2 or
                                   tables[0].shape[1] * 2 != x.shape[-1] or
                                   int(positions.max()) >= tables[0].shape[0]):
            raise ValueError("rope: tables must be (cos, sin) [max_pos, head_dim / 2] covering "
                             "every position")
        if dtype == torch.float32:
            pos = positions.to(torch.int32).contiguous().numpy()
            if tables is not None:
                return _run(ext.rope_tabled, _np(x), pos, _np(tables[0]), _np(tables[1]),
                            bool(interleaved))
            return _run(ext.rope, _np(x), pos, float(theta), bool(interleaved))
        c, s = _rope_cs(positions, x.shape[-1], theta, tables, dtype)
        c, s = c[:, None, :], s[:, None, :]
        x0, x1, join = _pairs(x, interleaved)
        return join(x0 * c - x1 * s, x0 * s + x1 * c)

    @staticmethod
    def backward(ctx, g):
        (positions,) = ctx.saved_tensors
        c, s = _rope_cs(positions, g.shape[-1], ctx.theta, ctx.tables, g.dtype)
        c, s = c[:, None, :], s[:, None, :]
        g0, g1, join = _pairs(g, ctx.interleaved)
        return join(g0 * c + g1 * s, g1 * c - g0 * s), None, None, None, None


def _rope_cs(positions, head_dim, theta, tables, dtype):
    if tables is None:
        return _rope_tables(positions, head_dim, theta, dtype)
    pos = positions.long()
    return tables[0][pos].to(dtype), tables[1][pos].to(dtype)


def rope_tables(theta, head_dim, max_pos, factor=0.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_pos=8192):
    """The engine's (cos, sin) float32 tables [max_pos, head_dim / 2] (engine::ModelRopeTables):
    Llama 3 rope scaling with factor > 0, kernels::RopeTable's with factor 0."""
    cs, sn = ext.rope_tables(float(theta), int(head_dim), int(max_pos), float(factor),
                             float(low_freq_factor), float(high_freq_factor),
                             int(original_max_pos))
    return torch.from_numpy(cs), torch.from_numpy(sn)


def rope(x, positions, theta=10000.0, interleaved=True, tables=None):
    """tables: None (kernels::RopeTable at theta) or rope_tables(...)' (cos, sin)."""
    return _Rope.apply(x, positions, theta, interleaved, tables)


# ---- SwiGLU --------------------------------------------------------------------------------

class _SwiGlu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        dtype = _check("swiglu", gate, up)
        if gate.shape != up.shape:
            raise ValueError("swiglu: gate and up must have the same shape")
        ctx.save_for_backward(gate, up)
        h = gate.shape[-1]
        if dtype == torch.float32:
            y = _run(ext.swiglu, _np(gate.reshape(-1, h)), _np(up.reshape(-1, h)))
            return y.reshape(gate.shape)
        return gate * torch.sigmoid(gate) * up

    @staticmethod
    def backward(ctx, g):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        ggate = g * up * (sig + gate * sig * (1 - sig))
        gup = g * gate * sig
        return ggate, gup


def swiglu(gate, up):
    return _SwiGlu.apply(gate, up)


# ---- attention -----------------------------------------------------------------------------

def _segments(cu_seqlens):
    cu = cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:]))


def _attn_probs(q, k, scale):
    """P [H, L, L] of one sequence (causal), k already expanded to H heads."""
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    n = q.shape[0]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, scale):
        dtype = _check("attention", q, k, v)
        if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or k.shape[0] != q.shape[0] \
                or k.shape[2] != q.shape[2] or q.shape[1] % k.shape[1]:
            raise ValueError("attention: q [rows, H, hd], k and v [rows, KVH, hd], H % KVH == 0")
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32)
        if cu.dim() != 1 or cu.numel() < 2 or cu[0] != 0 or cu[-1] != q.shape[0] \
                or (cu[1:] <= cu[:-1]).any():
            raise ValueError("attention: cu_seqlens must increase strictly from 0 to rows")
        ctx.scale = scale
        if dtype == torch.float32:
            out = _run(ext.attention, _np(q), _np(k), _np(v), cu.contiguous().numpy(),
                       float(scale))
            ctx.save_for_backward(q, k, v, cu, out)
            return out
        ctx.save_for_backward(q, k, v, cu)
        rep = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for a, b in _segments(cu):
            kk, vv = k[a:b].repeat_interleave(rep, 1), v[a:b].repeat_interleave(rep, 1)
            out[a:b] = torch.einsum("hij,jhd->ihd", _attn_probs(q[a:b], kk, scale), vv)
        return out

    @staticmethod
    def backward(ctx, g):
        if g.dtype == torch.float32:
            # The same formulas in plain C++ loops (python/ext): PyTorch's per-sequence einsums
            # on Debian's reference BLAS were most of a training step. Not bitwise anything.
            q, k, v, cu, out = ctx.saved_tensors
            gq, gk, gv = ext.attention_backward(_np(q), _np(k), _np(v), _np(out), _np(g),
                                                cu.contiguous().numpy(), float(ctx.scale))
            return torch.from_numpy(gq), torch.from_numpy(gk), torch.from_numpy(gv), None, None
        q, k, v, cu = ctx.saved_tensors
        scale, kvh = ctx.scale, k.shape[1]
        rep = q.shape[1] // kvh
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for a, b in _segments(cu):
            kk, vv = k[a:b].repeat_interleave(rep, 1), v[a:b].repeat_interleave(rep, 1)
            p = _attn_probs(q[a:b], kk, scale)
            go = g[a:b]
            dp = torch.einsum("ihd,jhd->hij", go, vv)
            ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            gq[a:b] = torch.einsum("hij,jhd->ihd", ds, kk) * scale
            n = b - a
            gk[a:b] = (torch.einsum("hij,ihd->jhd", ds, q[a:b]) * scale).reshape(
                n, kvh, rep, -1).sum(2)
            gv[a:b] = torch.einsum("hij,ihd->jhd", p, go).reshape(n, kvh, rep, -1).sum(2)
        return gq, gk, gv, None, None


def attention(q, k, v, cu_seqlens, scale=None):
    if scale is None:  # the engine's 1 / sqrt(head_dim), in float
        scale = float(np.float32(1.0) / np.sqrt(np.float32(q.shape[-1])))
    return _Attention.apply(q, k, v, cu_seqlens, scale)


# ---- log-softmax (the sampler's scoring) ---------------------------------------------------

class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, temperature):
        dtype = _check("log_softmax", x)
        t = float(temperature)
        if not np.isfinite(t) or t < 0:
            raise ValueError(f"log_softmax: temperature must be finite and >= 0, got {t}")
        t = t if t > 0 else 1.0  # greedy rollouts score at T == 1
        v = x.shape[-1]
        if dtype == torch.float32:
            y = _run(ext.log_softmax, _np(x.reshape(-1, v)), t).reshape(x.shape)
        else:
            y = torch.log_softmax(x / t, -1)
        ctx.save_for_backward(y)
        ctx.t = t
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return (g - torch.exp(y) * g.sum(-1, keepdim=True)) / ctx.t, None


def log_softmax(logits, temperature=1.0):
    return _LogSoftmax.apply(logits, temperature)
