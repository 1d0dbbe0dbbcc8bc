"""A plain PyTorch copy of Policy's model (torch.nn.functional only, no bitroll kernels).

For comparisons: gradients of a training step (python/tests/train_step_test.py) and speed
(tests/bench/bench_policy.py). Same parameters, same names, same math in PyTorch's own order, so
its logprobs are close to, not bitwise equal to, the service's.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn


class PlainPolicy(nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.config = policy.config
        self.params = nn.ParameterDict(
            {n.replace(".", "__"): nn.Parameter(p.detach().clone())
             for n, p in policy.named_parameters()})

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def state_named(self):
        return {n.replace("__", "."): p for n, p in self.params.items()}

    def _rms(self, x, w):
        return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.config.norm_eps))

    def _rope(self, x, positions):
        c = self.config
        hd = x.shape[-1]
        i = torch.arange(hd // 2, dtype=torch.float32)
        freq = 1.0 / (c.rope_theta ** (2 * i / hd))
        ang = positions.float()[:, None] * freq[None, :]
        cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).reshape(x.shape)

    def forward(self, tokens, cu_seqlens):
        c = self.config
        cu = cu_seqlens.tolist()
        lens = torch.tensor([b - a for a, b in zip(cu[:-1], cu[1:])])
        positions = torch.arange(tokens.numel()) - torch.repeat_interleave(
            torch.tensor(cu[:-1]), lens)
        x = F.embedding(tokens, self.p("tok_embeddings.weight"))
        rep = c.n_heads // c.n_kv_heads
        for i in range(c.n_layers):
            L = f"layers.{i}."
            h = self._rms(x, self.p(L + "attention_norm.weight"))
            q = F.linear(h, self.p(L + "attention.wq.weight")).reshape(-1, c.n_heads, c.head_dim)
            k = F.linear(h, self.p(L + "attention.wk.weight")).reshape(-1, c.n_kv_heads,
                                                                       c.head_dim)
            v = F.linear(h, self.p(L + "attention.wv.weight")).reshape(-1, c.n_kv_heads,
                                                                       c.head_dim)
            q, k = self._rope(q, positions), self._rope(k, positions)
            outs = []
            for a, b in zip(cu[:-1], cu[1:]):
                qq = q[a:b].transpose(0, 1)
                kk = k[a:b].repeat_interleave(rep, 1).transpose(0, 1)
                vv = v[a:b].repeat_interleave(rep, 1).transpose(0, 1)
                s = qq @ kk.transpose(1, 2) / c.head_dim ** 0.5
                mask = torch.ones(b - a, b - a, dtype=torch.bool).triu(1)
                att = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vv
                outs.append(att.transpose(0, 1).reshape(b - a, c.dim))
            x = x + F.linear(torch.cat(outs), self.p(L + "attention.wo.weight"))
            h = self._rms(x, self.p(L + "ffn_norm.weight"))
            g = F.linear(h, self.p(L + "feed_forward.w1.weight"))
            u = F.linear(h, self.p(L + "feed_forward.w3.weight"))
            x = x + F.linear(F.silu(g) * u, self.p(L + "feed_forward.w2.weight"))
        x = self._rms(x, self.p("norm.weight"))
        cls = self.p("tok_embeddings.weight") if c.shared_classifier else self.p("output.weight")
        return F.linear(x, cls)

    def logprobs(self, batch, temperature=1.0):
        """Like Policy.logprobs for a packed Batch."""
        t = temperature if temperature > 0 else 1.0
        logits = self.forward(batch.tokens, batch.cu_seqlens)
        lp = torch.log_softmax(logits[:-1] / t, -1).gather(1, batch.tokens[1:, None])[:, 0]
        out = torch.cat((torch.zeros(1), lp))
        first = torch.zeros(batch.tokens.numel(), dtype=torch.bool)
        first[batch.cu_seqlens[:-1].long()] = True
        return torch.where(first, torch.zeros(()), out)


def plain_copy(policy):
    """A PlainPolicy with a copy of policy's weights."""
    return PlainPolicy(copy.deepcopy(policy))
