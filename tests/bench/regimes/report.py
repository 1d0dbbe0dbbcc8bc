#!/usr/bin/env python3
"""The regime report: traces, a small sweep per regime, docs/regimes.md and its plots.

    report.py --bitroll build/rollout/bitroll --model MODEL_DIR --work WORK_DIR \\
        [--md docs/regimes.md --img docs/img] [--scale 1.0] [--reps 3] [--seed 1] \\
        [--only REGIME ...] [--from-results]  (the markdown and plots from WORK_DIR's results)

scripts/regime-report.sh is the one command (it writes the model and sets PYTHONPATH). Each
regime's trace (gen_trace.py) is replayed by run.py --reps times per sweep setting (every
setting once, then again: a slow spell of the shared machine falls on all alike). A setting is
a `bitroll serve` configuration: replicas x threads per replica, the per-replica batch limit
(the config file's replica_capacity: samples in flight on one replica), the KV cache size
(kv_cache_bytes), and, when `bitroll serve --help` lists them, the step token budget
(--max-step-tokens) and the sliding-window cache policy (--swa-cache full|checkpoint:P|
recompute). An axis serve does not have is skipped and the report says so. A run's figure is
the median over its requests (p90 where named); the report gives the median over the runs and
their spread, and the decision table names each regime's winner and whether its margin exceeds
the spread.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_trace  # noqa: E402

REGIMES = ("longctx", "chat", "agent", "rl", "mixed")
TITLES = {"longctx": "Long-context decode with repeated prefixes", "chat": "Short chat",
          "agent": "Coding agent sharing a repository", "rl": "Long RL trajectories (GRPO)",
          "mixed": "All of them on one endpoint"}
# Each regime's deciding metric: (key, label, True when higher is better).
PRIMARY = {"longctx": ("decode_tps", "decode tokens/s", True),
           "chat": ("ttft_p50", "TTFT p50 (s)", False),
           "agent": ("task_s_p50", "task time p50 (s)", False),
           "rl": ("traj_per_replica_hour", "trajectories per replica-hour", True),
           "mixed": ("e2e_p90", "end-to-end p90 (s)", False)}


def settings(flags, cores):
    """The sweep: [(name, run.py arguments)]; and the axes skipped, with why."""
    base = [("1x%d" % cores, ["--replicas", "1", "--threads", str(cores)]),
            ("%dx1" % cores, ["--replicas", str(cores), "--threads", "1"]),
            ("1x%d cap4" % cores, ["--replicas", "1", "--threads", str(cores),
                                   "--config-key", "replica_capacity=4"]),
            ("1x%d kv128" % cores, ["--replicas", "1", "--threads", str(cores),
                                    "--config-key", "kv_cache_bytes=%d" % (128 << 20)])]
    skipped = []
    b1 = base[0][1]
    if "--max-step-tokens" in flags:
        base += [("1x%d step128" % cores, b1 + ["--serve-arg=--max-step-tokens=128"]),
                 ("1x%d step2048" % cores, b1 + ["--serve-arg=--max-step-tokens=2048"])]
    else:
        skipped.append("step token budget (`bitroll serve --help` lists no --max-step-tokens; "
                       "the engine's default budget of 512 tokens applies)")
    if "--swa-cache" in flags:
        base = [(n + " swa-full", a + ["--serve-arg=--swa-cache=full"]) for n, a in base[:1]] + \
               base[1:] + \
               [("1x%d swa-ckpt512" % cores, b1 + ["--serve-arg=--swa-cache=checkpoint:512"]),
                ("1x%d swa-recompute" % cores, b1 + ["--serve-arg=--swa-cache=recompute"]),
                # where the policy matters most: a KV budget that full store fills
                ("1x%d kv128 swa-recompute" % cores,
                 base[3][1] + ["--serve-arg=--swa-cache=recompute"])]
    else:
        skipped.append("SWA prefix-cache policy (`bitroll serve --help` lists no --swa-cache "
                       "yet: every run keeps all sliding-window blocks, i.e. full store)")
    return base, skipped


def slug(name):
    return name.replace(" ", "_").replace(":", "")


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def med(xs):
    return pct(xs, 0.5)


def mdelta(res, name):
    def s(m):
        return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))
    return s(res["metrics_after"]) - s(res["metrics_before"])


def mdelta_tier(res, name, tier):
    def s(m):
        return sum(v for k, v in m.items() if k.startswith(name + "{") and f'tier="{tier}"' in k)
    return s(res["metrics_after"]) - s(res["metrics_before"])


def metrics(res):
    """The figures of one run (a dict; None where a figure has no data)."""
    reqs = res["requests"]
    ok = [r for r in reqs if r["finish"] is not None and r["trajectories"] == r["n"] and
          not (r["errors"] and r["trajectories"] < r["n"])]
    ttft = [r["first_token"] - r["submit"] for r in ok if r["first_token"] is not None]
    e2e = [r["finish"] - r["submit"] for r in ok]
    c = lambda r, k: r["cost"].get(k, 0.0)  # noqa: E731
    computed = sum(c(r, "prefill_computed") for r in reqs)
    cached = sum(c(r, "prefill_cached") for r in reqs)
    decode = sum(c(r, "decode_tokens") for r in reqs)
    engine_s = sum(c(r, "engine_seconds") for r in reqs)
    wall = res["wall_s"]
    reps = res["config"]["replicas"]
    run = [s["running"] for s in res["samples"] if s.get("running")]
    inflight = [s["inflight_requests"] for s in res["samples"] if s["inflight_requests"]]
    queued = [s.get("waiting", 0) + s.get("queued", 0) for s in res["samples"]]
    hit = [r for r in ok if c(r, "prefill_cached") > 0]
    miss = [r for r in ok if c(r, "prefill_cached") == 0]
    m = {"requests": len(reqs), "completed": len(ok),
         "failed": len(reqs) - len(ok), "retries": sum(r["retries"] for r in reqs),
         "errors": sum(len(r["errors"]) for r in reqs),
         "wall_s": wall, "ttft_p50": med(ttft), "ttft_p90": pct(ttft, 0.9),
         "e2e_p50": med(e2e), "e2e_p90": pct(e2e, 0.9),
         "queue_s_p50": med([c(r, "queue_seconds") / max(1, r["n"]) for r in ok]),
         "queued_max": max(queued) if queued else 0,
         "hit_rate": cached / (cached + computed) if cached + computed else None,
         "prefill_computed": computed, "prefill_cached": cached, "decode_tokens": decode,
         "decode_tps": decode / wall if wall else None,
         "prefill_tps": computed / wall if wall else None,
         "batch_p50": med(run), "batch_max": max(run) if run else None,
         "concurrency_p50": med(inflight),
         "ttft_hit_p50": med([r["first_token"] - r["submit"] for r in hit if r["first_token"]]),
         "ttft_miss_p50": med([r["first_token"] - r["submit"] for r in miss
                               if r["first_token"]]),
         "engine_s": engine_s,
         "hits_memory": mdelta_tier(res, "bitroll_prefix_cache_hit_tokens_total", "memory"),
         "hits_disk": mdelta_tier(res, "bitroll_prefix_cache_hit_tokens_total", "disk"),
         "preemptions": mdelta(res, "bitroll_preemptions_total"),
         "startup_s": res["config"].get("startup_s")}
    # Coding agent: tasks (all turns done), prefix length, reuse.
    tasks = {}
    for r in reqs:
        if r["task"]:
            tasks.setdefault(r["task"], []).append(r)
    if tasks:
        done = [ts for ts in tasks.values() if all(t in ok for t in ts)]
        m["tasks"] = len(tasks)
        m["tasks_done"] = len(done)
        m["task_cost_engine_s_p50"] = med([sum(c(t, "engine_seconds") for t in ts)
                                           for ts in done])
        m["task_s_p50"] = med([max(t["finish"] for t in ts) - min(t["submit"] for t in ts)
                               for ts in done])
        turns = [r for r in reqs if r["task"]]
        m["prompt_len_p50"] = med([r["prompt_len"] for r in turns])
        m["prefix_len"] = med([r["prefix_len"] for r in turns])
        m["reuse"] = sum(1 for r in turns if c(r, "prefill_cached") > 0) / len(turns)
        m["cached_frac_p50"] = med([c(r, "prefill_cached") / r["prompt_len"] for r in turns])
    # RL: cost per trajectory and trajectories per budget.
    trajs = sum(r["trajectories"] for r in reqs)
    m["trajectories"] = trajs
    m["cost_per_traj_engine_s"] = engine_s / trajs if trajs else None
    m["traj_per_replica_hour"] = trajs * 3600.0 / (wall * reps) if wall else None
    # Mixed: traffic shares by request and by token.
    share = {}
    for r in reqs:
        rg = r["id"].split("-")[1] if r["id"].startswith("mixed-") else r["regime"]
        s = share.setdefault(rg, {"requests": 0, "tokens": 0, "e2e": []})
        s["requests"] += 1
        s["tokens"] += r["prompt_len"] * r["n"] + r["tokens"]
        if r in ok:
            s["e2e"].append(r["finish"] - r["submit"])
    m["shares"] = {k: {"requests": v["requests"], "tokens": v["tokens"],
                       "e2e_p50": med(v["e2e"])} for k, v in share.items()}
    return m


def aggregate(runs):
    """The figures of several runs of one setting: each the median over the runs, "_spread" its
    (max - min) / median; the TTFTs pooled; samples and shares of the first run."""
    ms = [metrics(r) for r in runs]
    out, spread = {}, {}
    for k, v in ms[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs = [m[k] for m in ms if m.get(k) is not None]
            out[k] = med(xs)
            if len(xs) > 1 and out[k]:
                spread[k] = (max(xs) - min(xs)) / abs(out[k])
        else:
            out[k] = v
    out["runs"] = len(ms)
    out["_spread"] = spread
    out["_per_run"] = {k: [m.get(k) for m in ms] for k, _, _ in PRIMARY.values()}
    out["_ttft"] = [r["first_token"] - r["submit"] for res in runs for r in res["requests"]
                    if r["first_token"] is not None]
    out["_samples"] = runs[0]["samples"]
    out["_load"] = [x for r in runs for x in r["config"].get("loadavg", [])]
    return out


def fmt(x, d=2):
    if x is None:
        return "-"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer()):
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) < 1:
        return f"{x:.3f}"
    return f"{x:.{d}f}"


def table(rows, cols):
    out = ["| setting | " + " | ".join(h for h, _ in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for name, m in rows:
        out.append(f"| {name} | " + " | ".join(fmt(m.get(k)) for _, k in cols) + " |")
    return "\n".join(out)


COLS = {
    "longctx": [("hit rate", "hit_rate"), ("decode tok/s", "decode_tps"),
                ("concurrency p50", "concurrency_p50"), ("batch max", "batch_max"),
                ("TTFT hit p50 (s)", "ttft_hit_p50"), ("TTFT miss p50 (s)", "ttft_miss_p50"),
                ("e2e p50 (s)", "e2e_p50"), ("wall (s)", "wall_s")],
    "chat": [("TTFT p50 (s)", "ttft_p50"), ("TTFT p90 (s)", "ttft_p90"),
             ("e2e p50 (s)", "e2e_p50"), ("e2e p90 (s)", "e2e_p90"),
             ("prefill tok/s", "prefill_tps"), ("batch p50", "batch_p50"),
             ("batch max", "batch_max"), ("wall (s)", "wall_s")],
    "agent": [("prompt p50", "prompt_len_p50"), ("shared prefix", "prefix_len"),
              ("turns reusing", "reuse"), ("cached share p50", "cached_frac_p50"),
              ("TTFT hit p50 (s)", "ttft_hit_p50"), ("TTFT miss p50 (s)", "ttft_miss_p50"),
              ("memory-tier hit tokens", "hits_memory"), ("disk-tier", "hits_disk"),
              ("task engine-s p50", "task_cost_engine_s_p50"),
              ("task time p50 (s)", "task_s_p50"), ("tasks done", "tasks_done")],
    "rl": [("trajectories", "trajectories"), ("engine-s / traj", "cost_per_traj_engine_s"),
           ("traj / replica-hour", "traj_per_replica_hour"), ("decode tok/s", "decode_tps"),
           ("batch p50", "batch_p50"), ("total time (s)", "wall_s")],
    "mixed": [("TTFT p50 (s)", "ttft_p50"), ("e2e p50 (s)", "e2e_p50"),
              ("e2e p90 (s)", "e2e_p90"), ("queue p50 (s)", "queue_s_p50"),
              ("queued max", "queued_max"), ("hit rate", "hit_rate"),
              ("failed", "failed"), ("retries", "retries"), ("wall (s)", "wall_s")],
}


def grid(plt):
    """A figure with one panel per regime, two rows of three (the sixth panel off)."""
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    axes = list(axes.flat)
    axes[-1].axis("off")
    return fig, axes[:len(REGIMES)]


def plots(results, img_dir, md_dir):
    """Writes the PNGs; returns [(title, path relative to the markdown)]."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(img_dir, exist_ok=True)
    out = []
    # 1. Each regime's deciding metric per setting.
    fig, axes = grid(plt)
    for ax, rg in zip(axes, REGIMES):
        key, label, _ = PRIMARY[rg]
        names = [n for n, _ in results.get(rg, [])]
        vals = [m.get(key) or 0 for _, m in results.get(rg, [])]
        runs = [[x for x in m["_per_run"][key] if x is not None] or [0]
                for _, m in results.get(rg, [])]
        err = [[v - min(r) for v, r in zip(vals, runs)], [max(r) - v for v, r in zip(vals, runs)]]
        ax.bar(range(len(vals)), vals, color="#4c72b0", yerr=err, capsize=4)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{rg}: {label}", fontsize=9)
    fig.tight_layout()
    p = os.path.join(img_dir, "regimes-primary.png")
    fig.savefig(p, dpi=90)
    plt.close(fig)
    out.append(("Each regime's deciding metric per setting (median of the runs; bars: min-max)",
                p))
    # 2. TTFT distribution per regime, each setting.
    fig, axes = grid(plt)
    for ax, rg in zip(axes, REGIMES):
        for name, m in results.get(rg, []):
            xs = sorted(m["_ttft"])
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                        label=name)
        ax.set_xscale("log")
        ax.set_title(f"{rg}: TTFT CDF", fontsize=9)
        ax.set_xlabel("seconds", fontsize=8)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    p = os.path.join(img_dir, "regimes-ttft.png")
    fig.savefig(p, dpi=90)
    plt.close(fig)
    out.append(("Time to first token, cumulative distribution", p))
    # 3. The mixed endpoint over time: requests in flight and sequences running.
    mixed = results.get("mixed", [])
    if mixed:
        fig, axes = plt.subplots(1, len(mixed), figsize=(4 * len(mixed), 3.2), squeeze=False)
        for ax, (name, m) in zip(axes[0], mixed):
            s = m["_samples"]
            ax.plot([x["t"] for x in s], [x["inflight_requests"] for x in s],
                    label="requests in flight")
            ax.plot([x["t"] for x in s], [x.get("running", 0) for x in s],
                    label="sequences running")
            ax.plot([x["t"] for x in s], [x.get("waiting", 0) + x.get("queued", 0) for x in s],
                    label="waiting + queued")
            ax.set_title(f"mixed, {name}", fontsize=9)
            ax.set_xlabel("seconds", fontsize=8)
            ax.legend(fontsize=7)
        fig.tight_layout()
        p = os.path.join(img_dir, "regimes-mixed-timeline.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        out.append(("The mixed endpoint over time", p))
    return [(t, os.path.relpath(p, md_dir)) for t, p in out]


def decision(results):
    rows = ["| regime | deciding metric | best setting | median | runner-up | median | margin | "
            "spread of the two | paired runs won | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for rg in REGIMES:
        key, label, higher = PRIMARY[rg]
        rs = results.get(rg, [])
        ms = [(n, m[key], m["_spread"].get(key), m["_per_run"][key]) for n, m in rs
              if m.get(key) is not None]
        if not ms:
            continue
        ms.sort(key=lambda x: -x[1] if higher else x[1])
        best = ms[0]
        if len(ms) > 1:
            ru = ms[1]
            margin = (best[1] / ru[1] - 1) if higher else (ru[1] / best[1] - 1)
            spreads = [x for x in (best[2], ru[2]) if x is not None]
            noise = max(spreads) if spreads else None
            verdict = ("clear" if noise is not None and margin > noise else
                       "within noise")
            # Run k of every setting ran in the same pass: compare them pairwise.
            pairs = [(b, r) for b, r in zip(best[3], ru[3]) if b is not None and r is not None]
            won = sum(1 for b, r in pairs if (b > r if higher else b < r))
            rows.append(f"| {rg} | {label} | **{best[0]}** | {fmt(best[1])} | {ru[0]} | "
                        f"{fmt(ru[1])} | {margin * 100:+.0f}% | "
                        f"{'-' if noise is None else f'{noise * 100:.0f}%'} | "
                        f"{won} of {len(pairs)} | {verdict} |")
        else:
            rows.append(f"| {rg} | {label} | **{best[0]}** | {fmt(best[1])} | - | - | - | - | - "
                        "| - |")
    return "\n".join(rows)


def write_md(a, results, skipped, sweep, pics, run_info):
    L = []
    L.append("# Regime report: the hybrid model on this machine\n")
    L.append("Generated by\n\n```\n" + run_info["command"] + "\n```\n")
    L.append(
        "on " + run_info["machine"] + f", {run_info['date']} ({run_info['minutes']:.1f} min). "
        "**The machine is shared and noisy** (two cores, other builds and tests running at the "
        f"same time; load average {run_info['load']}): each setting ran {a.reps} times, "
        "interleaved with the others; a figure is the median over those runs of the run's "
        "own figure (itself the median over its requests, or the p90 where named). The "
        "decision table's spread is (max - min) / median over the runs; a win smaller than "
        "the spread is marked as within noise.\n")
    L.append(
        "Model: `bitroll make-model --shape hybrid-bench` (random weights, Qwen3, dim 256, "
        "12 layers, 4 heads / 2 KV heads of 64, vocabulary 8,192, context 8,192; Gemma-3-like "
        "five sliding layers of window 128 per full layer: layers 5 and 11 full; 13.6M "
        "parameters; f32 KV = 12 KiB per token). Traces: `tests/bench/regimes/gen_trace.py` "
        f"(seed {a.seed}, scale {a.scale}), replayed at their arrival times by "
        "`tests/bench/regimes/run.py` through the Python client (streamed tokens, "
        "temperature 1, EOS not a stop: outputs of max_tokens tokens unless a sampled BOS "
        "ends one).\n")
    L.append("Settings: `RxT` = R replicas of T kernel threads each (the machine's two cores "
             "either in one replica or split); `cap4` = at most 4 samples in flight per replica "
             "(the config file's `replica_capacity`; default 256); `kv128` = a 128 MiB KV cache "
             "per replica (`kv_cache_bytes`: about 10.9K tokens, against 65,536 by default "
             "here), "
             "so that long prefixes compete for it." + "".join(f" `{n}`" for n, _ in sweep[4:]) +
             "\n")
    if skipped:
        L.append("Axes not swept:\n")
        for s in skipped:
            L.append(f"- {s}")
        L.append("")
    L.append("Cost unit: engine-seconds (the cost record's `engine_seconds`: each engine step's "
             "time shared among its rows by token count). Trajectories per replica-hour = "
             "trajectories / (wall time x replicas). Hit rate = prefill tokens cached / "
             "(cached + computed), from the trajectories' cost records. The cache tier is the "
             "memory tier: `bitroll serve` has no disk-tier flag, so \"cache-tier latency\" "
             "is the TTFT of requests that hit against those that missed.\n")
    L.append("## Decision table\n")
    L.append("For each regime, the setting that wins its deciding metric on this machine (the "
             "median over its runs), by how much it beats the next best, the spread of those "
             "two settings' runs, and in how many passes (run k of every setting ran in the "
             "same pass) the winner beat the runner-up. \"clear\" = the margin exceeds the "
             "spread.\n")
    L.append(decision(results) + "\n")
    for rg in REGIMES:
        if rg not in results:
            continue
        h = run_info["headers"][rg]
        L.append(f"## {TITLES[rg]} (`{rg}`)\n")
        L.append(f"{h['requests']} requests; " + gen_trace_doc(rg) + "\n")
        L.append(table(results[rg], COLS[rg]) + "\n")
        if rg == "mixed" and results[rg]:
            name, m = results[rg][0]
            L.append(f"Traffic shares ({name}, its first run):\n")
            L.append("| regime | requests | tokens (prompt + output) | e2e p50 (s) |")
            L.append("|---|---|---|---|")
            tot_r = sum(v["requests"] for v in m["shares"].values())
            tot_t = sum(v["tokens"] for v in m["shares"].values())
            for k, v in sorted(m["shares"].items()):
                L.append(f"| {k} | {v['requests']} ({v['requests'] / tot_r:.0%}) | "
                         f"{v['tokens']:,} ({v['tokens'] / tot_t:.0%}) | {fmt(v['e2e_p50'])} |")
            L.append("")
    L.append("## Plots\n")
    for t, p in pics:
        L.append(f"![{t}]({p})\n")
    L.append("## Reproducing\n")
    L.append("`scripts/regime-report.sh` writes the model, the traces and the results (JSON, "
             "one file per regime, setting and run) under a work folder (`REGIME_WORK`, "
             "else a temporary one), then this file and `docs/img/regimes-*.png`. "
             "`REGIME_SCALE` (default 0.6) scales every trace's request count, `REGIME_REPS` "
             "(default 3) sets the runs per setting, `REGIME_ONLY=chat` runs one regime. "
             "The runner alone: `tests/bench/regimes/run.py --help`; extra serve flags pass "
             "through with `--serve-arg=--flag=value`.")
    with open(a.md, "w") as f:
        f.write("\n".join(L) + "\n")


def gen_trace_doc(rg):
    return {
        "longctx": "two documents of 6,144 tokens (3/4 of the context) chosen by Zipf(1.2), a "
                   "question of ~48 tokens, output ~96; Poisson arrivals at 0.4/s.",
        "chat": "a shared 64-token system prompt plus a user turn of ~160 tokens (lognormal), "
                "output ~48 (at most 256); Poisson arrivals at 2/s.",
        "agent": "tasks of 5 turns on one of two 3,072-token repositories; each turn adds "
                 "~160 tokens of tool output to the previous prompt, output ~32; closed loop "
                 "(0.2 s think time), tasks start at 0.25/s.",
        "rl": "GRPO groups of 4 samples, a shared 128-token instruction plus a ~192-token "
              "problem, output ~384 (at most 1,024); bursts of 3 groups every 6 s.",
        "mixed": "chat 50%, agent 25%, RL 15%, long-context 10% of about 30 requests (an "
                 "RL group or an agent turn is one request), each from its own generator, "
                 "merged by arrival time on one endpoint.",
    }[rg]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--md", default="docs/regimes.md")
    ap.add_argument("--img", default="docs/img")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--reps", type=int, default=3, help="runs per regime and setting")
    ap.add_argument("--from-results", action="store_true")
    ap.add_argument("--command", default="scripts/regime-report.sh")
    a = ap.parse_args()
    t_begin = time.time()
    os.makedirs(a.work, exist_ok=True)
    help_out = subprocess.run([a.bitroll, "serve", "--help"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True).stdout
    cores = 2 if (os.cpu_count() or 1) >= 2 else 1
    sweep, skipped = settings(set(help_out.replace("=", " ").split()), cores)
    regimes = [r for r in REGIMES if not a.only or r in a.only]
    results, headers = {}, {}
    for rg in regimes:
        tpath = os.path.join(a.work, f"{rg}.jsonl")
        if not a.from_results:
            with open(tpath, "w") as f:
                f.write(gen_trace.dumps(gen_trace.generate(rg, a.seed, a.scale)))
        headers[rg], _ = gen_trace.load(tpath)
        runs = {name: [] for name, _ in sweep}
        # Repetition outermost: every setting once, then again, so that a slow spell of the
        # shared machine falls on all settings alike.
        for k in range(a.reps):
            for name, args in sweep:
                rpath = os.path.join(a.work, f"{rg}.{slug(name)}.r{k}.json")
                if not a.from_results:
                    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--bitroll",
                           a.bitroll, "--model", a.model, "--trace", tpath, "--out",
                           rpath] + args
                    print(f"report.py: {rg} / {name} / run {k + 1} of {a.reps}",
                          file=sys.stderr, flush=True)
                    rc = subprocess.run(cmd).returncode
                    if rc != 0:
                        print(f"report.py: run failed ({rc}): {' '.join(cmd)}",
                              file=sys.stderr)
                if os.path.exists(rpath):
                    with open(rpath) as f:
                        runs[name].append(json.load(f))
        results[rg] = [(name, aggregate(rs)) for name, rs in runs.items() if rs]
    md_dir = os.path.dirname(os.path.abspath(a.md))
    pics = plots(results, os.path.abspath(a.img), md_dir)
    info = {"command": a.command, "headers": headers,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores "
                       f"({cpu_name()})",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "minutes": run_minutes(a.work, regimes, t_begin), "load": load_range(results)}
    write_md(a, results, skipped, sweep, pics, info)
    with open(os.path.join(a.work, "summary.json"), "w") as f:
        json.dump({rg: [(n, {k: v for k, v in m.items() if not k.startswith("_")})
                        for n, m in rs] for rg, rs in results.items()}, f, indent=1)
    print(f"report.py: wrote {a.md}", file=sys.stderr)
    return 0


def load_range(results):
    """The 1-minute load averages seen at the runs' starts and ends, as "lo-hi"."""
    xs = [x for rs in results.values() for _, m in rs for x in m.get("_load", [])]
    return f"{min(xs):.1f}-{max(xs):.1f}" if xs else "not recorded"


def run_minutes(work, regimes, t_begin):
    """Minutes from the first trace written to the last result (file times, so that
    --from-results reports the run it reads)."""
    first = [os.path.getmtime(os.path.join(work, f"{rg}.jsonl")) for rg in regimes
             if os.path.exists(os.path.join(work, f"{rg}.jsonl"))]
    last = [os.path.getmtime(os.path.join(work, f)) for f in os.listdir(work)
            if f.endswith(".json") and f != "summary.json"]
    if not first or not last:
        return (time.time() - t_begin) / 60.0
    return (max(last) - min(first)) / 60.0


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
