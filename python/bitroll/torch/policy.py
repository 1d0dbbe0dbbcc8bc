"""Policy: the Llama-family model the engine serves, as an nn.Module on bitroll's kernels.

    policy = Policy.from_file("stories260K.bin")          # llama2.c checkpoint (or make-model's)
    batch = pack([prompt + completion, ...])              # or pad([...])
    lp = policy.logprobs(batch, temperature=1.0)          # the service's logprob bits
    per_traj = policy.completion_logprobs(prompts, [t.ids for t in trajs],
                                          [t.mask for t in trajs], temperature=1.0)
    client.update_weights_tensors(policy.weights(), version=2)

Parameter names are the served model's tensor names (docs/weights.md, llama2.c family:
tok_embeddings.weight, layers.{i}.attention.wq.weight, ..., norm.weight, output.weight when the
classifier is not tied), so policy.state_dict() is what the service installs.

Parity: every row op runs the engine's kernel on that row alone, matmuls are one fma chain per
output, attention runs the engine's chunked order over each sequence from position 0, and the
scoring is the sampler's log-softmax of logits / T. So a token's logprob depends only on the
weights and its own sequence, never on the batch size, packing, order or thread count, and it
equals the bits the rollout reported (prefill == decode).

Hugging Face folders (Qwen3, Qwen3-MoE, Qwen2-MoE, Llama): Policy.from_pretrained(dir) returns
an HfPolicy (hf_policy.py), which also replays MoE routing records.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from . import ops


@dataclass
class ModelConfig:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    max_seq_len: int
    shared_classifier: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_interleaved: bool = True  # llama2.c pairs (2i, 2i+1)

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def kv_dim(self):
        return self.head_dim * self.n_kv_heads


@dataclass
class Batch:
    """Packed trajectories: tokens [T] (int64), cu_seqlens [B+1] (int32), and where they came
    from: shape (B, L) and index [T] into the flattened [B * L] padded layout (None when
    packed)."""
    tokens: torch.Tensor
    cu_seqlens: torch.Tensor
    padded_shape: tuple = None
    index: torch.Tensor = None


def pack(sequences):
    """A packed Batch of token-id sequences (each >= 1 token)."""
    seqs = [list(map(int, s)) for s in sequences]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pack: need one or more non-empty sequences")
    cu = np.zeros(len(seqs) + 1, np.int32)
    cu[1:] = np.cumsum([len(s) for s in seqs])
    return Batch(torch.tensor([t for s in seqs for t in s], dtype=torch.int64),
                 torch.from_numpy(cu))


def pad(sequences, pad_id=0, left=False):
    """(tokens [B, L], attention_mask [B, L]) padded on the right (or left)."""
    seqs = [list(map(int, s)) for s in sequences]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pad: need one or more non-empty sequences")
    n = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), n), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), n), dtype=torch.bool)
    for i, s in enumerate(seqs):
        sl = slice(n - len(s), n) if left else slice(0, len(s))
        tokens[i, sl] = torch.tensor(s)
        mask[i, sl] = True
    return tokens, mask


def _from_padded(tokens, attention_mask):
    if tokens.dim() != 2 or attention_mask is None or attention_mask.shape != tokens.shape:
        raise ValueError("padded batches are tokens [B, L] with an attention_mask [B, L]")
    m = attention_mask.bool()
    lens = m.sum(1)
    if (lens == 0).any():
        raise ValueError("padded batch: a row has no tokens")
    # Valid tokens of a row must be contiguous (left or right padding).
    first = m.int().argmax(1)
    ar = torch.arange(tokens.shape[1])[None, :]
    if not torch.equal(m, (ar >= first[:, None]) & (ar < (first + lens)[:, None])):
        raise ValueError("padded batch: each row's tokens must be contiguous")
    index = torch.nonzero(m.reshape(-1)).reshape(-1)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    return Batch(tokens.reshape(-1)[index], cu, tuple(tokens.shape), index)


class _Linear(nn.Module):
    def __init__(self, n, k, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, k))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)


class _Norm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)


class _Embedding(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab, d))


class _Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wq = _Linear(c.dim, c.dim)
        self.wk = _Linear(c.kv_dim, c.dim)
        self.wv = _Linear(c.kv_dim, c.dim)
        self.wo = _Linear(c.dim, c.dim)


class _FeedForward(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = _Linear(c.hidden_dim, c.dim)
        self.w2 = _Linear(c.dim, c.hidden_dim)
        self.w3 = _Linear(c.hidden_dim, c.dim)


class _Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm = _Norm(c.dim, c.norm_eps)
        self.attention = _Attention(c)
        self.ffn_norm = _Norm(c.dim, c.norm_eps)
        self.feed_forward = _FeedForward(c)


class Policy(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.config = config
        if c.dim % c.n_heads or c.n_heads % c.n_kv_heads or c.head_dim % 2:
            raise ValueError(f"unsupported shape {c}")
        self.tok_embeddings = _Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.n_layers))
        self.norm = _Norm(c.dim, c.norm_eps)
        if not c.shared_classifier:
            self.output = _Linear(c.vocab_size, c.dim)

    # ---- loading and exporting -------------------------------------------------------------

    @classmethod
    def from_file(cls, path):
        """A llama2.c checkpoint (legacy format, as `bitroll make-model` writes too)."""
        from ..model_files import load_llama2c
        with open(path, "rb") as f:
            head = np.frombuffer(f.read(28), np.int32)
        if len(head) != 7:
            raise ValueError(f"{path}: not a llama2.c checkpoint")
        dim, hidden, layers, heads, kv_heads, vocab, seq = (int(v) for v in head)
        config = ModelConfig(dim, hidden, layers, heads, kv_heads, abs(vocab), seq,
                             shared_classifier=vocab > 0)
        policy = cls(config)
        tensors, _ = load_llama2c(path)
        policy.load_state_dict({n: torch.from_numpy(np.array(a)) for n, a in tensors})
        return policy

    @staticmethod
    def from_pretrained(path):
        """A Hugging Face folder (config.json + *.safetensors) as hf_policy.HfPolicy."""
        from .hf_policy import HfPolicy
        return HfPolicy.from_pretrained(path)

    def weights(self):
        """[(name, float32 numpy array)] for Client.update_weights_tensors."""
        return [(n, t.detach().contiguous().numpy()) for n, t in self.state_dict().items()]

    # ---- forward ---------------------------------------------------------------------------

    def _block(self, layer, x, positions, cu):
        c = self.config
        h = layer.attention_norm(x)
        a = layer.attention
        q = ops.rope(a.wq(h).reshape(-1, c.n_heads, c.head_dim), positions, c.rope_theta,
                     c.rope_interleaved)
        k = ops.rope(a.wk(h).reshape(-1, c.n_kv_heads, c.head_dim), positions, c.rope_theta,
                     c.rope_interleaved)
        v = a.wv(h).reshape(-1, c.n_kv_heads, c.head_dim)
        att = ops.attention(q, k, v, cu).reshape(-1, c.dim)
        x = x + a.wo(att)
        h = layer.ffn_norm(x)
        f = layer.feed_forward
        return x + f.w2(ops.swiglu(f.w1(h), f.w3(h)))

    def forward(self, tokens, cu_seqlens):
        """Logits [T, vocab] of packed sequences (tokens [T], cu_seqlens [B+1])."""
        c = self.config
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32)
        if tokens.dim() != 1 or cu.dim() != 1 or cu.numel() < 2 or cu[0] != 0 \
                or cu[-1] != tokens.numel() or (cu[1:] <= cu[:-1]).any():
            raise ValueError("forward: tokens [T] and cu_seqlens [B+1] rising from 0 to T")
        if (tokens < 0).any() or (tokens >= c.vocab_size).any():
            raise ValueError(f"forward: a token id outside [0, {c.vocab_size})")
        lens = (cu[1:] - cu[:-1]).long()
        if lens.max() > c.max_seq_len:
            raise ValueError(f"forward: a sequence is longer than max_seq_len {c.max_seq_len}")
        starts = torch.repeat_interleave(cu[:-1].long(), lens)
        positions = (torch.arange(tokens.numel()) - starts).to(torch.int32)
        x = nn.functional.embedding(tokens, self.tok_embeddings.weight)
        for layer in self.layers:
            x = self._block(layer, x, positions, cu)
        x = self.norm(x)
        cls = self.tok_embeddings.weight if c.shared_classifier else self.output.weight
        return ops.linear(x, cls)

    def logprobs(self, batch, attention_mask=None, temperature=1.0):
        """The logprob of every token given the tokens before it in its sequence, as the service
        scores it at `temperature` (0 = greedy scores at 1).

        batch: a Batch from pack() -> returns [T] (packed order), or tokens [B, L] with
        attention_mask [B, L] (from pad()) -> returns [B, L]. A sequence's first token and
        padding have no logprob: 0 there. Pick the scored tokens (completion, not tool-injected)
        with your own mask.
        """
        if not isinstance(batch, Batch):
            batch = _from_padded(torch.as_tensor(batch), torch.as_tensor(attention_mask))
        logits = self.forward(batch.tokens, batch.cu_seqlens)
        lp = ops.log_softmax(logits[:-1], temperature)
        nxt = batch.tokens[1:]
        got = lp.gather(1, nxt[:, None]).reshape(-1)
        first = torch.zeros(batch.tokens.numel(), dtype=torch.bool)
        first[batch.cu_seqlens[:-1].long()] = True
        out = torch.cat((torch.zeros(1, dtype=got.dtype), got))
        out = torch.where(first, torch.zeros((), dtype=got.dtype), out)
        if batch.index is None:
            return out
        full = torch.zeros(batch.padded_shape[0] * batch.padded_shape[1], dtype=out.dtype)
        full = full.index_put((batch.index,), out)
        return full.reshape(batch.padded_shape)

    def completion_logprobs(self, prompts, completions, masks=None, temperature=1.0):
        """Per trajectory, the logprobs of its completion tokens as the service reports them
        (Trajectory.logprobs): float32 [len(completion)], 0 at injected tokens (mask 0), in one
        packed batch. prompts and completions are token-id sequences (completion >= 1 token);
        masks (optional) are 1 for sampled and 0 for injected tokens. Differentiable."""
        return completion_rows(prompts, completions, masks,
                               lambda batch: self.logprobs(batch, temperature=temperature))[0]


def completion_rows(prompts, completions, masks, logprobs):
    """completion_logprobs of both policies: checks the lists, packs prompt + completion per
    trajectory, calls logprobs(batch) (a [tokens] tensor, or (tensor, extra)) and slices each
    completion's rows, 0 where masks says injected. Returns (rows, extra or None)."""
    if len(prompts) != len(completions) or (masks is not None and
                                            len(masks) != len(completions)):
        raise ValueError("completion_logprobs: prompts, completions and masks differ in length")
    prompts = [[int(t) for t in p] for p in prompts]
    completions = [[int(t) for t in c] for c in completions]
    if any(len(p) == 0 or len(c) == 0 for p, c in zip(prompts, completions)):
        raise ValueError("completion_logprobs: empty prompt or completion")
    batch = pack([p + c for p, c in zip(prompts, completions)])
    res = logprobs(batch)
    lp, extra = res if isinstance(res, tuple) else (res, None)
    out = []
    for i, (p, c, start) in enumerate(zip(prompts, completions,
                                          batch.cu_seqlens[:-1].tolist())):
        row = lp[start + len(p):start + len(p) + len(c)]
        if masks is not None:
            m = torch.as_tensor(np.asarray(masks[i]), dtype=torch.bool)
            if m.shape != row.shape:
                raise ValueError(f"completion_logprobs: mask {i} has {m.numel()} entries, "
                                 f"the completion {len(c)}")
            row = torch.where(m, row, torch.zeros((), dtype=row.dtype))
        out.append(row)
    return out, extra
