"""HfPolicy: a Hugging Face-folder model the engine serves (Qwen3, Qwen3-MoE, Qwen2-MoE, Llama
and Llama 3 rope scaling), as an nn.Module on bitroll's kernels, with MoE routing replay.

    policy = Policy.from_pretrained("qwen3-moe-dir")      # config.json + *.safetensors
    lp, routes = policy.logprobs(batch, routes=[t.routing for t in trajs], return_routes=True)

Parameter names are the checkpoint's tensor names (model.layers.{i}.self_attn.q_proj.weight,
model.layers.{i}.mlp.experts.{e}.gate_proj.weight, lm_head.weight, ...), as the engine loads
them (engine/loaders/hf.cc), so policy.weights() is what update_weights_tensors sends.

Parity: the engine's order (engine/transformer.cc, engine/moe.cc). Per layer: RMSNorm, q/k/v
projections (+ bias for Qwen2-family), Qwen3's QK-norm (RMSNorm over each head's q and k),
half-split RoPE (Llama 3 scaling: the engine's own tables, engine/rope_scaling.cc), attention,
o_proj, residual add; then RMSNorm and the FFN. A MoE FFN runs the
router (one matmul), moe_ops.route (the engine's softmax and top-k), each expert's SwiGLU MLP on
the rows routed to it (gathered in (row, slot) order, as the engine does; a matmul output never
depends on the other rows), and moe_ops.combine (fma in slot order, + the shared expert).

Routing replay (routes=): each sequence's recorded routes, [P, n_layers, k] expert ids and fp32
weights in slot order (Trajectory.routing, or `generate --json --routes`' record), force the
experts and the combine weights of its first P positions (P = len or len - 1: the record holds
every position that entered the model, so the last token may have none; it then uses the
router, which cannot change any scored logprob). The router still runs; return_routes=True
returns the policy's own routes, so a trainer can check that the rollout's routing still holds.
Gradient (replay_weights): "recorded" (default) treats the recorded weights as constants, so the
router gets no gradient from forced positions; "router" combines with the current router's
softmax at the forced ids (Megatron's RouterReplay): the same bits while on-policy, and the router
is trained.
"""

import json
import os

import numpy as np
import torch
from torch import nn

from . import moe_ops, ops
from .policy import Batch, _Embedding, _from_padded, _Linear, _Norm, completion_rows


class _Mlp(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate_proj, self.up_proj = _Linear(hidden, d), _Linear(hidden, d)
        self.down_proj = _Linear(d, hidden)

    def forward(self, x):
        return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))


class _Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = _Linear(c["num_experts"], c["hidden_size"])
        self.experts = nn.ModuleList(_Mlp(c["hidden_size"], c["moe_intermediate_size"])
                                     for _ in range(c["num_experts"]))
        sh = c.get("shared_expert_intermediate_size", 0) or 0
        if sh:
            self.shared_expert = _Mlp(c["hidden_size"], sh)
            self.shared_expert_gate = _Linear(1, c["hidden_size"])
        self.k, self.norm = c["num_experts_per_tok"], c["norm_topk_prob"]

    def forward(self, x, forced_ids, forced_w, forced, replay_weights):
        """(out [n, d], own ids [n, k], own weights [n, k]); forced [n] bool picks the rows whose
        ids / weights come from forced_ids / forced_w."""
        logits = self.gate(x)
        ids, w = moe_ops.route(logits, self.k, self.norm)
        use_ids, use_w = ids, w
        if forced is not None and forced.any():
            use_ids = torch.where(forced[:, None], forced_ids, ids)
            if replay_weights == "router":
                _, use_w = moe_ops.route(logits, self.k, self.norm, use_ids)
            else:
                use_w = torch.where(forced[:, None], forced_w.to(w.dtype), w)
        n, k = use_ids.shape
        flat = use_ids.reshape(-1)
        parts, where = [], []
        for e, expert in enumerate(self.experts):
            slots = torch.nonzero(flat == e).reshape(-1)  # row * k + slot, in order
            if slots.numel():
                parts.append(expert(x[slots // k]))
                where.append(slots)
        order = torch.cat(where)
        ys = torch.cat(parts).index_select(0, torch.argsort(order)).reshape(n, k, -1)
        gate = shared = None
        if hasattr(self, "shared_expert"):
            shared = self.shared_expert(x)
            gate = self.shared_expert_gate(x).reshape(-1)
        return moe_ops.combine(use_w, ys, gate, shared), ids, w


class _Attn(nn.Module):
    def __init__(self, c, bias, qk_norm):
        super().__init__()
        d, hd = c["hidden_size"], c["head_dim"]
        qd, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        self.q_proj, self.k_proj = _Linear(qd, d, bias), _Linear(kv, d, bias)
        self.v_proj, self.o_proj = _Linear(kv, d, bias), _Linear(d, qd)
        if qk_norm:
            self.q_norm, self.k_norm = _Norm(hd, c["rms_norm_eps"]), _Norm(hd, c["rms_norm_eps"])


class _Layer(nn.Module):
    def __init__(self, c, bias, qk_norm, moe):
        super().__init__()
        eps = c["rms_norm_eps"]
        self.input_layernorm = _Norm(c["hidden_size"], eps)
        self.self_attn = _Attn(c, bias, qk_norm)
        self.post_attention_layernorm = _Norm(c["hidden_size"], eps)
        self.mlp = _Moe(c) if moe else _Mlp(c["hidden_size"], c["intermediate_size"])


_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
          "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen2MoeForCausalLM": "qwen2_moe"}


def read_config(path):
    """config.json of a Hugging Face folder, with the defaults engine/loaders/hf.cc applies."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    arch = _ARCHS.get((c.get("architectures") or [""])[0])
    if arch is None:
        raise ValueError(f"{path}: architecture {c.get('architectures')} is not supported "
                         f"({sorted(_ARCHS)})")
    rs = c.get("rope_scaling")
    kind = rs.get("rope_type", rs.get("type")) if rs else None
    if kind not in (None, "default", "llama3"):
        raise ValueError(f"{path}: rope_scaling {rs} is not supported (only llama3)")
    c["llama3_rope"] = rs if kind == "llama3" else None
    c["arch"] = arch
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c["head_dim"] = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("rope_theta", 10000.0)
    if arch.endswith("moe"):
        c.setdefault("norm_topk_prob", arch == "qwen3_moe")
        if c.get("decoder_sparse_step", 1) != 1 or c.get("mlp_only_layers"):
            raise ValueError(f"{path}: dense layers in a MoE model are not supported")
    return c


class HfPolicy(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.config = config
        arch = c["arch"]
        self.is_moe = arch.endswith("moe")
        bias, qk_norm = arch in ("qwen2", "qwen2_moe"), arch.startswith("qwen3")
        self.model = nn.Module()
        self.model.embed_tokens = _Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList(_Layer(c, bias, qk_norm, self.is_moe)
                                          for _ in range(c["num_hidden_layers"]))
        self.model.norm = _Norm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = bool(c.get("tie_word_embeddings", False))
        rs = c["llama3_rope"]
        self._rope = None if rs is None else ops.rope_tables(
            np.float32(c["rope_theta"]), c["head_dim"], c["max_position_embeddings"],
            rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
            rs["original_max_position_embeddings"])
        if not self.tied:
            self.lm_head = _Linear(c["vocab_size"], c["hidden_size"])

    @classmethod
    def from_pretrained(cls, path):
        from ..model_files import load_safetensors
        policy = cls(read_config(path))
        state = {}
        for name, a in load_safetensors(path):
            if isinstance(a, tuple):
                from ..model_files import bf16_to_f32
                a = bf16_to_f32(a[0])
            state[name] = torch.from_numpy(np.array(a, np.float32))
        if policy.tied:
            state.pop("lm_head.weight", None)
        policy.load_state_dict(state)
        return policy

    def weights(self):
        """[(name, float32 numpy array)] for Client.update_weights_tensors."""
        return [(n, t.detach().contiguous().numpy()) for n, t in self.state_dict().items()]

    @property
    def route_shape(self):
        c = self.config
        return (c["num_hidden_layers"], c["num_experts_per_tok"]) if self.is_moe else None

    # ---- forward ---------------------------------------------------------------------------

    def _attention(self, a, h, positions, cu):
        c = self.config
        hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        q = a.q_proj(h).reshape(-1, nh, hd)
        k = a.k_proj(h).reshape(-1, nkv, hd)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        theta = float(np.float32(c["rope_theta"]))
        q = ops.rope(q, positions, theta, False, self._rope)
        k = ops.rope(k, positions, theta, False, self._rope)
        v = a.v_proj(h).reshape(-1, nkv, hd)
        return a.o_proj(ops.attention(q, k, v, cu).reshape(-1, nh * hd))

    def forward(self, tokens, cu_seqlens, routes=None, replay_weights="recorded"):
        """(logits [T, vocab], own routes) of packed sequences. routes: None or (ids [T, L, k],
        weights [T, L, k], forced [T] bool), positions in packed order. own routes: (ids int32
        [T, L, k], weights float32 [T, L, k]) the router chose, or None for a dense model."""
        c = self.config
        if replay_weights not in ("recorded", "router"):
            raise ValueError(f"replay_weights must be 'recorded' or 'router', got "
                             f"{replay_weights!r}")
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int32)
        if tokens.dim() != 1 or cu.dim() != 1 or cu.numel() < 2 or cu[0] != 0 \
                or cu[-1] != tokens.numel() or (cu[1:] <= cu[:-1]).any():
            raise ValueError("forward: tokens [T] and cu_seqlens [B+1] rising from 0 to T")
        if (tokens < 0).any() or (tokens >= c["vocab_size"]).any():
            raise ValueError(f"forward: a token id outside [0, {c['vocab_size']})")
        lens = (cu[1:] - cu[:-1]).long()
        if lens.max() > c["max_position_embeddings"]:
            raise ValueError("forward: a sequence is longer than max_position_embeddings")
        if routes is not None and not self.is_moe:
            raise ValueError("forward: routes given to a dense (non-MoE) model")
        starts = torch.repeat_interleave(cu[:-1].long(), lens)
        positions = (torch.arange(tokens.numel()) - starts).to(torch.int32)
        x = nn.functional.embedding(tokens, self.model.embed_tokens.weight)
        own_ids, own_w = [], []
        for li, layer in enumerate(self.model.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), positions, cu)
            h = layer.post_attention_layernorm(x)
            if self.is_moe:
                fi = fw = fm = None
                if routes is not None:
                    fi, fw, fm = routes[0][:, li], routes[1][:, li], routes[2]
                y, ids, w = layer.mlp(h, fi, fw, fm, replay_weights)
                own_ids.append(ids)
                own_w.append(w.detach())
            else:
                y = layer.mlp(h)
            x = x + y
        x = self.model.norm(x)
        cls = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        own = None
        if self.is_moe:
            own = (torch.stack(own_ids, 1).to(torch.int32), torch.stack(own_w, 1))
        return ops.linear(x, cls), own

    def _packed_routes(self, batch, routes):
        """(ids [T, L, k], weights [T, L, k], forced [T]) from per-sequence records."""
        if not self.is_moe:
            raise ValueError("routes given to a dense (non-MoE) model")
        n_seq = batch.cu_seqlens.numel() - 1
        if len(routes) != n_seq:
            raise ValueError(f"routes: {len(routes)} records for {n_seq} sequences")
        L, k = self.route_shape
        E = self.config["num_experts"]
        T = batch.tokens.numel()
        ids = torch.zeros(T, L, k, dtype=torch.int64)
        ws = torch.zeros(T, L, k, dtype=torch.float32)
        forced = torch.zeros(T, dtype=torch.bool)
        cu = batch.cu_seqlens.tolist()
        for i, r in enumerate(routes):
            if r is None:
                continue
            if isinstance(r, dict):
                if r.get("n_experts", E) != E:
                    raise ValueError(f"routes[{i}]: a record of {r['n_experts']} experts for a "
                                     f"model of {E}")
                ri, rw = r["expert_ids"], r["weights"]
            else:
                ri, rw = r
            ri = np.asarray(ri)
            rw = np.asarray(rw)
            n = cu[i + 1] - cu[i]
            if ri.ndim != 3 or ri.shape[1:] != (L, k) or rw.shape != ri.shape \
                    or ri.shape[0] not in (n, n - 1):
                raise ValueError(f"routes[{i}]: expert ids {ri.shape} and weights {rw.shape} must "
                                 f"both be [positions, {L}, {k}] with positions {n} or {n - 1} "
                                 f"(the sequence has {n} tokens)")
            if not np.issubdtype(ri.dtype, np.integer) or rw.dtype != np.float32:
                raise ValueError(f"routes[{i}]: expert ids must be integers and weights float32")
            if ri.size and (ri.min() < 0 or ri.max() >= E):
                raise ValueError(f"routes[{i}]: an expert id outside [0, {E})")
            if not np.isfinite(rw).all():
                raise ValueError(f"routes[{i}]: a weight is not finite")
            srt = np.sort(ri, -1)
            if (srt[..., 1:] == srt[..., :-1]).any():
                raise ValueError(f"routes[{i}]: one expert twice in a position's top-{k}")
            p = ri.shape[0]
            ids[cu[i]:cu[i] + p] = torch.from_numpy(ri.astype(np.int64))
            ws[cu[i]:cu[i] + p] = torch.from_numpy(np.ascontiguousarray(rw))
            forced[cu[i]:cu[i] + p] = True
        return ids, ws, forced

    def logprobs(self, batch, attention_mask=None, temperature=1.0, routes=None,
                 return_routes=False, replay_weights="recorded"):
        """As Policy.logprobs; routes (MoE): one record per sequence (batch order; a
        Trajectory.routing dict, an (ids, weights) pair, or None = not forced). return_routes:
        also return, per sequence, the policy's own {"expert_ids": int32 [len, L, k], "weights":
        float32 [len, L, k]} (None for a dense model)."""
        if not isinstance(batch, Batch):
            batch = _from_padded(torch.as_tensor(batch), torch.as_tensor(attention_mask))
        packed = None if routes is None else self._packed_routes(batch, routes)
        logits, own = self.forward(batch.tokens, batch.cu_seqlens, packed, replay_weights)
        lp = ops.log_softmax(logits[:-1], temperature)
        got = lp.gather(1, batch.tokens[1:, None]).reshape(-1)
        first = torch.zeros(batch.tokens.numel(), dtype=torch.bool)
        first[batch.cu_seqlens[:-1].long()] = True
        out = torch.cat((torch.zeros(1, dtype=got.dtype), got))
        out = torch.where(first, torch.zeros((), dtype=got.dtype), out)
        if batch.index is not None:
            full = torch.zeros(batch.padded_shape[0] * batch.padded_shape[1], dtype=out.dtype)
            out = full.index_put((batch.index,), out).reshape(batch.padded_shape)
        if not return_routes:
            return out
        per_seq = None
        if own is not None:
            cu = batch.cu_seqlens.tolist()
            per_seq = [{"expert_ids": own[0][a:b].numpy(), "weights": own[1][a:b].numpy()}
                       for a, b in zip(cu[:-1], cu[1:])]
        return out, per_seq

    def completion_logprobs(self, prompts, completions, masks=None, temperature=1.0,
                            routes=None, return_routes=False, replay_weights="recorded"):
        """As Policy.completion_logprobs; routes / return_routes as in logprobs, per trajectory
        (positions of prompt + completion)."""
        out, own = completion_rows(
            prompts, completions, masks,
            lambda batch: self.logprobs(batch, temperature=temperature, routes=routes,
                                        return_routes=return_routes,
                                        replay_weights=replay_weights))
        return (out, own) if return_routes else out


def routes_equal(a, b):
    """Whether two routing records agree bitwise (expert ids and weight bits) over the positions
    both cover: a trainer's on-policy check of policy routes against the rollout's."""
    ai, aw = (a["expert_ids"], a["weights"]) if isinstance(a, dict) else a
    bi, bw = (b["expert_ids"], b["weights"]) if isinstance(b, dict) else b
    n = min(len(ai), len(bi))
    return bool(np.array_equal(np.asarray(ai[:n], np.int64), np.asarray(bi[:n], np.int64)) and
                np.array_equal(np.asarray(aw[:n], np.float32).view(np.uint32),
                               np.asarray(bw[:n], np.float32).view(np.uint32)))
