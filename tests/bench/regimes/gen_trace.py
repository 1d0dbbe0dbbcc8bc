#!/usr/bin/env python3
"""Seeded request traces for the five serving regimes of issue 17 (docs/regimes.md).

    gen_trace.py --regime chat --seed 1 --out chat.jsonl [--scale 1.0] [--vocab 8192] [--ctx 8192]

Regimes (each: prompt and output length distributions, prefix sharing, arrival pattern):

  longctx  long-context decode with repeated prefixes: a few long documents (about 3/4 of the
           context), each request one document plus a short question; documents chosen by a
           Zipf(1.2) law, so the popular ones repeat; output lognormal (median 96); Poisson
           arrivals.
  chat     short chat: one shared system prompt (64 tokens) plus a user turn lognormal (median
           160); output lognormal (median 48, at most 256); Poisson arrivals.
  agent    a coding agent sharing a repository: a few repositories (prefix ~3K tokens), tasks
           of several turns on one repository; turn k's prompt is turn k-1's prompt plus new
           tool output (lognormal, median 160), so every turn extends the last one's prefix;
           short outputs (median 32). Turns are closed-loop: turn k goes `think_s` seconds
           after turn k-1 finished ("after" names it); tasks start as a Poisson process.
  rl       long RL trajectories: GRPO groups (n samples of one prompt), a shared instruction
           prefix (128 tokens) plus a problem (lognormal, median 192), long outputs (lognormal,
           median 384, at most 1024); groups arrive in bursts (a training step submits a batch
           of groups at once).
  mixed    all of them on one endpoint: each regime generated from its own seeded stream with
           about its share (SHARES) of 30 requests (at scale 1; an RL group and an agent turn
           count as one), merged by arrival time; ids and prefixes stay distinct per regime.

Output: JSON Lines. The first line is the header {"trace": 1, "regime", "seed", "scale",
"vocab", "ctx", "requests"}; then one request per line, sorted by arrival time t:

  {"id": "chat-3", "regime": "chat", "t": 1.25, "prompt": [ids], "n": 1, "max_tokens": 48,
   "seed": 7, "prefix": "chat-system", "prefix_len": 64, "task": null, "turn": 0,
   "after": null, "think_s": 0.0}

`prefix` names the shared prefix the prompt starts with (its first `prefix_len` tokens are the
same in every request naming it); `task` groups an agent's turns; `after` is the id of the
request that must finish first, then `think_s` seconds pass before this one is submitted (t is
then the earliest time). Token ids are drawn uniformly from [3, vocab) (0-2 are the byte
tokenizer's NUL/BOS/EOS bytes; the runner also submits with stop_at_eos off, so outputs have
exactly max_tokens tokens unless a sampled BOS ends them). Length caps scale with ctx (at 8K
they are the figures above; prompt + output always fit in ctx). The same (regime, seed, scale,
vocab, ctx) always gives the same bytes: one random.Random(seed) per regime, no other source of
randomness.
"""

import argparse
import json
import math
import random
import sys

REGIMES = ("longctx", "chat", "agent", "rl", "mixed")
SHARES = {"chat": 0.50, "agent": 0.25, "rl": 0.15, "longctx": 0.10}  # of mixed's requests
MIXED_REQUESTS = 30  # at scale 1
BASE_REQUESTS = {"chat": 40, "agent": 20, "rl": 6, "longctx": 10}  # each regime at scale 1
LO_ID = 3


def _lognormal(rng, median, sigma, lo, hi):
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))))


def _tokens(rng, n, vocab):
    return [rng.randrange(LO_ID, vocab) for _ in range(n)]


def _zipf(rng, k, s):
    w = [1.0 / (i + 1) ** s for i in range(k)]
    return rng.choices(range(k), weights=w)[0]


def _req(rid, regime, t, prompt, max_tokens, seed, prefix, prefix_len, n=1, task=None, turn=0,
         after=None, think_s=0.0):
    return {"id": rid, "regime": regime, "t": round(t, 6), "prompt": prompt, "n": n,
            "max_tokens": max_tokens, "seed": seed, "prefix": prefix, "prefix_len": prefix_len,
            "task": task, "turn": turn, "after": after, "think_s": think_s}


def longctx(rng, scale, vocab, ctx, tag="longctx"):
    n_docs, n_req, rate = 2, max(2, round(10 * scale)), 0.4
    doc_len = (ctx * 3) // 4
    docs = [_tokens(rng, doc_len, vocab) for _ in range(n_docs)]
    out, t = [], 0.0
    for i in range(n_req):
        d = _zipf(rng, n_docs, 1.2)
        q = _tokens(rng, _lognormal(rng, 48, 0.4, 8, min(128, ctx // 16)), vocab)
        mt = _lognormal(rng, 96, 0.3, 16, min(192, ctx // 16))
        out.append(_req(f"{tag}-{i}", "longctx", t, docs[d] + q, mt, rng.randrange(1 << 31),
                        f"{tag}-doc{d}", doc_len))
        t += rng.expovariate(rate)
    return out


def chat(rng, scale, vocab, ctx, tag="chat"):
    n_req, rate = max(2, round(40 * scale)), 2.0
    system = _tokens(rng, 64, vocab)
    out, t = [], 0.0
    for i in range(n_req):
        user = _tokens(rng, _lognormal(rng, 160, 0.6, 8, min(1024, ctx // 4)), vocab)
        mt = _lognormal(rng, 48, 0.6, 4, min(256, ctx // 4))
        out.append(_req(f"{tag}-{i}", "chat", t, system + user, mt, rng.randrange(1 << 31),
                        f"{tag}-system", len(system)))
        t += rng.expovariate(rate)
    return out


def agent(rng, scale, vocab, ctx, tag="agent"):
    n_repos, n_tasks, turns, rate, think = 2, max(1, round(4 * scale)), 5, 0.25, 0.2
    repo_len = min(3072, ctx // 2)
    repos = [_tokens(rng, repo_len, vocab) for _ in range(n_repos)]
    out, t = [], 0.0
    for k in range(n_tasks):
        r = _zipf(rng, n_repos, 1.0)
        task = _tokens(rng, _lognormal(rng, 64, 0.4, 8, min(256, ctx // 8)), vocab)
        prompt = repos[r] + task
        prev = None
        for j in range(turns):
            if j > 0:
                tool = _lognormal(rng, 160, 0.6, 8, min(512, ctx // 8))
                prompt = prompt + _tokens(rng, tool, vocab)
            if len(prompt) + 64 >= ctx:
                break
            rid = f"{tag}-{k}.{j}"
            out.append(_req(rid, "agent", t, list(prompt), _lognormal(rng, 32, 0.4, 4, 64),
                            rng.randrange(1 << 31), f"{tag}-repo{r}", repo_len,
                            task=f"{tag}-{k}", turn=j, after=prev,
                            think_s=think if prev else 0.0))
            prev = rid
        t += rng.expovariate(rate)
    return out


def rl(rng, scale, vocab, ctx, tag="rl"):
    n_groups, n, burst, gap = max(1, round(6 * scale)), 4, 3, 6.0
    instr = _tokens(rng, 128, vocab)
    out = []
    for g in range(n_groups):
        t = (g // burst) * gap  # a training step submits `burst` groups at once
        problem = _tokens(rng, _lognormal(rng, 192, 0.5, 16, min(1024, ctx // 8)), vocab)
        mt = _lognormal(rng, 384, 0.4, 64, min(1024, ctx // 4))
        out.append(_req(f"{tag}-{g}", "rl", t, instr + problem, mt, rng.randrange(1 << 31),
                        f"{tag}-instruction", len(instr), n=n))
    return out


def mixed(rng, scale, vocab, ctx):
    # Every regime from its own seeded stream (derived from this one), scaled so that its
    # requests (an RL group or an agent turn is one request) are about SHARES of MIXED_REQUESTS.
    out = []
    for name, share in sorted(SHARES.items()):
        sub = random.Random(rng.randrange(1 << 62))
        sub_scale = share * MIXED_REQUESTS * scale / BASE_REQUESTS[name]
        out += GEN[name](sub, sub_scale, vocab, ctx, tag=f"mixed-{name}")
    return out


GEN = {"longctx": longctx, "chat": chat, "agent": agent, "rl": rl, "mixed": mixed}


def generate(regime, seed, scale=1.0, vocab=8192, ctx=8192):
    """The trace as a list of dicts: the header, then the requests sorted by (t, id)."""
    if regime not in GEN:
        raise ValueError(f"unknown regime {regime!r} (known: {', '.join(REGIMES)})")
    if not scale > 0 or vocab <= LO_ID + 1 or ctx < 512:
        raise ValueError("need scale > 0, vocab > 4, ctx >= 512")
    reqs = GEN[regime](random.Random(f"{regime}/{seed}"), scale, vocab, ctx)
    reqs.sort(key=lambda r: (r["t"], r["id"]))
    for r in reqs:  # the caps above keep every request inside the context
        if len(r["prompt"]) + r["max_tokens"] >= ctx:
            raise ValueError(f"{r['id']}: prompt + output do not fit in ctx {ctx}")
    head = {"trace": 1, "regime": regime, "seed": seed, "scale": scale, "vocab": vocab,
            "ctx": ctx, "requests": len(reqs)}
    return [head] + reqs


def dumps(trace):
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in trace)


def load(path):
    """(header, requests) of a trace file."""
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    if not lines or lines[0].get("trace") != 1:
        raise ValueError(f"{path}: not a version-1 trace (no header)")
    return lines[0], lines[1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regime", required=True, choices=REGIMES)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the request counts")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=8192, help="the model's context length")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    try:
        text = dumps(generate(a.regime, a.seed, a.scale, a.vocab, a.ctx))
    except ValueError as e:
        print(f"gen_trace.py: {e}", file=sys.stderr)
        return 2
    if a.out == "-":
        sys.stdout.write(text)
    else:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
