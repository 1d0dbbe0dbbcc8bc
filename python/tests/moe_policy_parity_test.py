"""Policy.from_pretrained (HfPolicy) equals `bitroll generate --json` bit for bit on Hugging
Face-folder models, and replays MoE routing records.

Models: make-model's qwen3-tiny (QK-norm, head_dim != dim / heads), llama3-tiny (Llama 3 rope
scaling), qwen3-moe-tiny (8 experts, top-2, norm_topk_prob) and qwen2-moe-tiny (shared expert
with its sigmoid gate, q/k/v biases). Trajectories (prompts of 1..12 tokens, completions up to
40 tokens) at T = 1 and 0.8, with routing records (--routes) for the MoE models. Checks, bitwise
(uint32 views):
  * logprobs at batch sizes 1, 3, 8, all, packed and padded (right, left), 1 and 2 threads;
  * the policy's own routes equal the recorded routes (ids and weight bits);
  * forcing the recorded routes gives the same logprobs (replay_weights "recorded", "router").
Negative controls: a perturbed route (one position's expert id in one layer) changes the next
token's logprob and leaves the earlier one; torch.nn.functional.linear in one expert (one q_proj
for dense models) breaks parity, and so does dropping llama3-tiny's rope scaling. Bad routes
raise ValueError. The backward through forced routes: no router gradient with the recorded
weights, a router gradient with replay_weights="router".
"""

import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bitroll.torch as bt  # noqa: E402
from bitroll.torch import Policy, pack, pad, routes_equal  # noqa: E402

c = tc.Checks()


def trajectories(model, temperature, seed, routes):
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in (0, 3, 6, 11)]
    out = []
    for max_tokens in (9, 40):
        out += tc.generate(a.bitroll, model, prompts, 2, seed, max_tokens, temperature,
                           extra=["--routes"] if routes else [])
    return out


def record_routes(r):
    """A record's routing as (ids [P, L, k], weights float32 [P, L, k])."""
    g = r["routing"]
    shape = tuple(g["shape"])
    ids = np.array(g["expert_ids"], np.int64).reshape(shape)
    w = np.array([int(b, 16) for b in g["weight_bits"]], np.uint32).view(np.float32)
    return ids, w.reshape(shape)


def want_bits(r):
    return np.array([int(b, 16) for b in r["logprob_bits"]], np.uint32)


def score(policy, recs, bs, layout, temperature, threads, routes=None, **kw):
    """(per record completion logprob bits, per record own routes)."""
    bt.set_num_threads(threads)
    got, own = [None] * len(recs), [None] * len(recs)
    for i in range(0, len(recs), bs):
        idx = list(range(i, min(i + bs, len(recs))))
        seqs = [recs[j]["prompt_ids"] + recs[j]["ids"] for j in idx]
        rr = None if routes is None else [routes[j] for j in idx]
        with torch.no_grad():
            if layout == "packed":
                batch = pack(seqs)
                lp, ro = policy.logprobs(batch, temperature=temperature, routes=rr,
                                         return_routes=True, **kw)
                starts = batch.cu_seqlens[:-1].tolist()
                rows = [lp[s:s + len(q)] for s, q in zip(starts, seqs)]
            else:
                toks, mask = pad(seqs, left=(layout == "left-padded"))
                lp, ro = policy.logprobs(toks, mask, temperature=temperature, routes=rr,
                                         return_routes=True, **kw)
                rows = [lp[r][mask[r]] for r in range(len(seqs))]
        for n, (j, row) in enumerate(zip(idx, rows)):
            got[j] = tc.bits(row[len(recs[j]["prompt_ids"]):].numpy())
            own[j] = None if ro is None else ro[n]
    bt.set_num_threads(1)
    return got, own


def all_equal(recs, got):
    return all(np.array_equal(g, want_bits(r)) for r, g in zip(recs, got))


def raises(fn, what):
    try:
        fn()
    except ValueError as e:
        c.check(True, f"{what}: ValueError ({e})")
        return
    c.check(False, f"{what}: no ValueError")


with tempfile.TemporaryDirectory() as tmp:
    for shape in ("qwen3-tiny", "llama3-tiny", "qwen3-moe-tiny", "qwen2-moe-tiny"):
        d = os.path.join(tmp, shape)
        subprocess.run([a.bitroll, "make-model", "--shape", shape, "--out", d, "--seed", "7"],
                       check=True, capture_output=True)
        policy = Policy.from_pretrained(d)
        moe = policy.is_moe
        for temperature, seed in ((1.0, 21), (0.8, 22)):
            recs = trajectories(d, temperature, seed, moe)
            random.Random(seed).shuffle(recs)
            tokens = sum(len(r["ids"]) for r in recs)
            routes = [record_routes(r) for r in recs] if moe else None
            configs = [(1, "packed", 1), (3, "padded", 2), (8, "left-padded", 1),
                       (8, "packed", 2), (len(recs), "packed", 1)]
            for bs, layout, threads in configs:
                got, own = score(policy, recs, bs, layout, temperature, threads)
                c.check(all_equal(recs, got), f"{shape} T={temperature}: {len(recs)} "
                        f"trajectories ({tokens} scored tokens), batch {bs} {layout}, "
                        f"{threads} thread(s): logprob bits equal generate's")
                if moe:
                    c.check(all(routes_equal(o, w) and len(o["expert_ids"]) == len(w[0]) + 1
                                for o, w in zip(own, routes)),
                            f"{shape}: the policy's routes equal the recorded routes (ids, "
                            f"weight bits; {sum(len(w[0]) for w in routes)} positions)")
            if not moe:
                continue
            for bs, layout, threads, rw in ((3, "packed", 1, "recorded"),
                                            (8, "padded", 2, "recorded"),
                                            (8, "packed", 1, "router")):
                got, _ = score(policy, recs, bs, layout, temperature, threads, routes,
                               replay_weights=rw)
                c.check(all_equal(recs, got), f"{shape} T={temperature}: forcing the recorded "
                        f"routes (weights {rw}), batch {bs} {layout}, {threads} thread(s): "
                        "same bits")

        # Negative control: one position's expert in one layer swapped for another.
        recs = trajectories(d, 1.0, 21, moe)
        if moe:
            j = max(range(len(recs)), key=lambda i: len(recs[i]["ids"]))
            r, (ids, w) = recs[j], record_routes(recs[j])
            p = len(r["prompt_ids"])  # the first completion token's position
            bad = ids.copy()
            k_experts = policy.config["num_experts"]
            bad[p, 1, 0] = next(e for e in range(k_experts) if e not in ids[p, 1])
            got, _ = score(policy, [r], 1, "packed", 1.0, 1, [(bad, w)])
            want = want_bits(r)
            c.check(got[0][1] != want[1] and np.array_equal(got[0][:1], want[:1]),
                    f"{shape} negative control: expert {ids[p, 1, 0]} -> {bad[p, 1, 0]} at "
                    f"position {p} layer 1 changes the next token's logprob "
                    f"({want[1]:08x} -> {got[0][1]:08x}), not the earlier one")
            got, _ = score(policy, [r], 1, "packed", 1.0, 1, [(ids, w)])
            c.check(np.array_equal(got[0], want), f"{shape}: the true route again: parity")
            # The gradient through forced routes: "recorded" weights are constants (no router
            # gradient), "router" weights train the router; the experts train either way.
            seq = pack([r["prompt_ids"] + r["ids"]])
            for rw in ("recorded", "router"):
                policy.zero_grad()
                policy.logprobs(seq, routes=[(ids, w)], replay_weights=rw).sum().backward()
                mlp = policy.model.layers[0].mlp
                gr = mlp.gate.weight.grad
                ge = sum(float(x.down_proj.weight.grad.abs().sum()) for x in mlp.experts
                         if x.down_proj.weight.grad is not None)
                router_ok = (gr is None or not gr.any()) if rw == "recorded" else \
                    (gr is not None and bool(gr.any()))
                c.check(router_ok and ge > 0, f"{shape}: backward with replay_weights {rw}: "
                        f"router gradient {'zero' if rw == 'recorded' else 'nonzero'}, "
                        f"experts' nonzero ({ge:.3g})")
            policy.zero_grad()
            # Bad routes: typed errors.
            raises(lambda: policy.logprobs(seq, routes=[(ids[:-2], w[:-2])]),
                   f"{shape}: routes of the wrong length")
            oob = ids.copy()
            oob[0, 0, 0] = k_experts
            raises(lambda: policy.logprobs(seq, routes=[(oob, w)]),
                   f"{shape}: an expert id out of range")
            raises(lambda: policy.logprobs(seq, routes=[]), f"{shape}: no record per sequence")
            raises(lambda: policy.logprobs(seq, routes=[{"n_experts": k_experts + 1,
                                                         "expert_ids": ids, "weights": w}]),
                   f"{shape}: a record of another expert count")
            dup = ids.copy()
            dup[0, 0, 1] = dup[0, 0, 0]
            raises(lambda: policy.logprobs(seq, routes=[(dup, w)]),
                   f"{shape}: one expert twice in a position")
            raises(lambda: policy.logprobs(seq, routes=[(ids[:, :1], w[:, :1])]),
                   f"{shape}: records of the wrong layer count")
            raises(lambda: policy.logprobs(seq, routes=[(ids, w.astype(np.float64))]),
                   f"{shape}: float64 weights")
            # Negative control: torch's own linear in the busiest expert of layer 0.
            busiest = np.bincount(np.concatenate([record_routes(x)[0][:, 0].ravel()
                                                  for x in recs])).argmax()
            lin = policy.model.layers[0].mlp.experts[int(busiest)].gate_proj
        else:
            raises(lambda: policy.logprobs(pack([[1, 5, 6]]), routes=[None]),
                   f"{shape}: routes given to a dense model")
            lin = policy.model.layers[1].self_attn.q_proj
        if shape == "llama3-tiny":  # control: the same model without its rope scaling
            tables, policy._rope = policy._rope, None
            got, _ = score(policy, recs, 8, "packed", 1.0, 1)
            policy._rope = tables
            differ = sum(int((g != want_bits(r)).sum()) for r, g in zip(recs, got))
            c.check(differ > 0, f"{shape} negative control: without the llama3 rope scaling "
                    f"{differ} logprob(s) differ")
        saved = lin.forward
        lin.forward = lambda x: torch.nn.functional.linear(x, lin.weight)
        got, _ = score(policy, recs, 8, "packed", 1.0, 1)
        lin.forward = saved
        differ = sum(int((g != want_bits(r)).sum()) for r, g in zip(recs, got))
        c.check(differ > 0, f"{shape} negative control: torch.nn.functional.linear in "
                f"{'an expert' if moe else 'one q_proj'} changes {differ} logprob(s)")
        got, _ = score(policy, recs, 8, "packed", 1.0, 1)
        c.check(all_equal(recs, got), f"{shape}: parity again once the kernel is back")
c.done()
