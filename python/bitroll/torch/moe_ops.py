"""The mixture-of-experts row steps of engine/moe.cc as PyTorch autograd functions.

Like ops.py: float32 -> the engine's bits (bitroll_kernels_ext.moe_route / moe_combine),
float64 -> plain PyTorch math (the reference gradcheck differentiates), backward in PyTorch.

  route(logits [n, E], k, norm_topk_prob, forced_ids=None) -> (ids int64 [n, k], weights [n, k])
      p = softmax(logits); top-k by repeated arg-max (ties to the lowest id) unless forced_ids
      [n, k] gives the experts (routing replay); w_j = p[id_j], divided by sum_j w_j (slot order)
      with norm_topk_prob. Differentiable in logits through the weights (ids are integers).
  combine(weights [n, k], ys [n, k, d], gate [n] or None, shared [n, d] or None) -> [n, d]
      sum_j w_j y_j by fma in slot order, then + sigmoid(gate) * shared (Qwen2-MoE).
"""

import torch

from ._ext import ext
from .ops import _check, _np


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, k, norm, forced):
        dtype = _check("moe_route", logits)
        if logits.dim() != 2 or not 1 <= k <= logits.shape[1]:
            raise ValueError("moe_route: logits must be [rows, n_experts] with 1 <= k <= n_experts")
        if forced is not None:
            if forced.shape != (logits.shape[0], k):
                raise ValueError(f"moe_route: forced ids must be [{logits.shape[0]}, {k}], got "
                                 f"{tuple(forced.shape)}")
            if (forced < 0).any() or (forced >= logits.shape[1]).any():
                raise ValueError(f"moe_route: a forced expert id outside [0, {logits.shape[1]})")
        if dtype == torch.float32:
            f = None if forced is None else forced.to(torch.int32).contiguous().numpy()
            ids, w, p = ext.moe_route(_np(logits), int(k), bool(norm), f)
            ids, w, p = torch.from_numpy(ids).long(), torch.from_numpy(w), torch.from_numpy(p)
        else:
            p = torch.softmax(logits, -1)
            if forced is None:
                ids = torch.empty(logits.shape[0], k, dtype=torch.int64)
                q = p.clone()
                for j in range(k):  # argmax returns the first (lowest id) maximum
                    ids[:, j] = q.argmax(-1)
                    q.scatter_(1, ids[:, j:j + 1], float("-inf"))
            else:
                ids = forced.long()
            w = p.gather(1, ids)
            if norm:
                w = w / w.sum(-1, keepdim=True)
        ctx.save_for_backward(p, ids, w)
        ctx.norm = norm
        ctx.mark_non_differentiable(ids)
        return ids, w

    @staticmethod
    def backward(ctx, _gids, gw):
        p, ids, w = ctx.saved_tensors
        if ctx.norm:
            s = p.gather(1, ids).sum(-1, keepdim=True)
            gsel = (gw - (gw * w).sum(-1, keepdim=True)) / s
        else:
            gsel = gw
        gp = torch.zeros_like(p).scatter_add(1, ids, gsel)
        return p * (gp - (p * gp).sum(-1, keepdim=True)), None, None, None


def route(logits, k, norm_topk_prob, forced_ids=None):
    return _Route.apply(logits, int(k), bool(norm_topk_prob), forced_ids)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, ys, gate, shared):
        dtype = _check("moe_combine", w, ys, gate, shared)
        if w.dim() != 2 or ys.dim() != 3 or ys.shape[:2] != w.shape:
            raise ValueError("moe_combine: weights [n, k] and ys [n, k, d]")
        if (gate is None) != (shared is None) or (gate is not None and (
                gate.shape != (w.shape[0],) or shared.shape != (w.shape[0], ys.shape[2]))):
            raise ValueError("moe_combine: gate [n] and shared [n, d] go together")
        ctx.save_for_backward(w, ys, gate, shared)
        if dtype == torch.float32:
            args = (None, None) if gate is None else (_np(gate), _np(shared))
            return torch.from_numpy(ext.moe_combine(_np(w), _np(ys), *args))
        out = (w[..., None] * ys).sum(1)
        if gate is not None:
            out = out + torch.sigmoid(gate)[:, None] * shared
        return out

    @staticmethod
    def backward(ctx, g):
        w, ys, gate, shared = ctx.saved_tensors
        gw = (g[:, None, :] * ys).sum(-1)
        gys = w[..., None] * g[:, None, :]
        ggate = gshared = None
        if gate is not None:
            sg = torch.sigmoid(gate)
            gshared = sg[:, None] * g
            ggate = (g * shared).sum(-1) * sg * (1 - sg)
        return gw, gys, ggate, gshared


def combine(weights, ys, gate=None, shared=None):
    return _Combine.apply(weights, ys, gate, shared)
