#!/usr/bin/env python3
"""Keeps the regime benchmark's tooling working (CTest regimes_tooling_test, label regimes).

    regimes_test.py --bitroll build/rollout/bitroll     (PYTHONPATH=<build>/python)

1. gen_trace.py is a function of its seed: each regime twice with seed 1 gives the same bytes
   (compared as bytes), seed 2 gives other bytes (negative control); the trace keeps its own
   promises (sorted by t, requests naming one prefix share its first prefix_len tokens, every
   "after" names an earlier turn of the same task, ids in [3, vocab)).
2. run.py replays a tiny mixed trace (every regime) through `bitroll serve` on make-model's
   swa-5to1-tiny: every request finishes, with first token and finish times in order, at most
   max_tokens tokens per sample, each agent turn submitted only after its previous turn finished
   plus the think time and served partly from the prefix cache; report.py's metrics() reads
   the result. The same checks on a record with one turn moved before its predecessor's finish
   must fail (negative control).
Exit status 0 = pass.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_trace  # noqa: E402
import report  # noqa: E402


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def check_trace(vocab, ctx):
    for rg in gen_trace.REGIMES:
        a = gen_trace.dumps(gen_trace.generate(rg, 1, 0.5, vocab, ctx)).encode()
        b = gen_trace.dumps(gen_trace.generate(rg, 1, 0.5, vocab, ctx)).encode()
        c = gen_trace.dumps(gen_trace.generate(rg, 2, 0.5, vocab, ctx)).encode()
        if a != b:
            fail(f"{rg}: seed 1 gave two different traces")
        if a == c:
            fail(f"{rg}: seeds 1 and 2 gave the same trace (negative control)")
        reqs = gen_trace.generate(rg, 1, 0.5, vocab, ctx)[1:]
        if not reqs:
            fail(f"{rg}: empty trace")
        if [r["t"] for r in reqs] != sorted(r["t"] for r in reqs):
            fail(f"{rg}: not sorted by arrival time")
        heads, ids = {}, {r["id"]: r for r in reqs}
        for r in reqs:
            if not all(3 <= x < vocab for x in r["prompt"]) or len(r["prompt"]) >= ctx:
                fail(f"{rg}: {r['id']} has ids outside [3, vocab) or is too long")
            h = r["prompt"][:r["prefix_len"]]
            if heads.setdefault(r["prefix"], h) != h:
                fail(f"{rg}: {r['id']} does not start with prefix {r['prefix']}")
            if r["after"] is not None:
                prev = ids.get(r["after"])
                if prev is None or prev["task"] != r["task"] or prev["turn"] != r["turn"] - 1:
                    fail(f"{rg}: {r['id']} is after {r['after']}, not its previous turn")
                if r["prompt"][:len(prev["prompt"])] != prev["prompt"]:
                    fail(f"{rg}: {r['id']} does not extend its previous turn's prompt")
    if gen_trace.generate("mixed", 1, 0.5, vocab, ctx)[0]["requests"] < 5:
        fail("mixed: too few requests")


def check_run(res, trace):
    """Problems of one run.py result (a list of strings; empty = fine)."""
    bad = []
    recs = {r["id"]: r for r in res["requests"]}
    reqs = {r["id"]: r for r in trace}
    for rid, q in reqs.items():
        r = recs.get(rid)
        if r is None or r["finish"] is None or r["errors"]:
            bad.append(f"{rid}: not finished ({r and r['errors']})")
            continue
        if not (q["t"] <= r["submit"] + 0.05 and r["submit"] <= r["first_token"] <= r["finish"]):
            bad.append(f"{rid}: times out of order {q['t']} {r['submit']} {r['first_token']} "
                       f"{r['finish']}")
        if r["trajectories"] != q["n"] or not 0 < r["tokens"] <= q["n"] * q["max_tokens"]:
            bad.append(f"{rid}: {r['trajectories']} trajectories, {r['tokens']} tokens")
        if q["after"] is not None:
            prev = recs[q["after"]]
            if prev["finish"] is None or r["submit"] < prev["finish"] + q["think_s"] - 1e-3:
                bad.append(f"{rid}: submitted before {q['after']} finished + think time")
            if r["cost"].get("prefill_cached", 0) <= 0:
                bad.append(f"{rid}: a later agent turn got no prefix-cache hit")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitroll", required=True)
    a = ap.parse_args()
    check_trace(512, 512)
    with tempfile.TemporaryDirectory(prefix="regimes-test-") as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([a.bitroll, "make-model", "--shape", "swa-5to1-tiny", "--out", model],
                       check=True, stdout=subprocess.DEVNULL)
        trace = os.path.join(tmp, "mixed.jsonl")
        with open(trace, "w") as f:
            f.write(gen_trace.dumps(gen_trace.generate("mixed", 3, 0.25, 512, 512)))
        out = os.path.join(tmp, "mixed.json")
        rc = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--bitroll",
                             a.bitroll, "--model", model, "--trace", trace, "--out", out,
                             "--timeout", "90"]).returncode
        if rc != 0:
            fail(f"run.py exited {rc}")
        with open(out) as f:
            res = json.load(f)
        _, reqs = gen_trace.load(trace)
        if not any(r["after"] for r in reqs):
            fail("the test trace has no closed-loop agent turn")
        bad = check_run(res, reqs)
        if bad:
            fail("; ".join(bad))
        m = report.metrics(res)
        for k in ("ttft_p50", "e2e_p90", "hit_rate", "decode_tps", "traj_per_replica_hour"):
            if m.get(k) is None:
                fail(f"metrics(): no {k}")
        if m["completed"] != len(reqs) or set(m["shares"]) != set(gen_trace.SHARES):
            fail(f"metrics(): {m['completed']} completed, shares {sorted(m['shares'])}")
        # Negative control: a turn moved to before its predecessor finished is caught.
        late = next(r for r in reqs if r["after"])
        broken = json.loads(json.dumps(res))
        for r in broken["requests"]:
            if r["id"] == late["id"]:
                prev = next(x for x in broken["requests"] if x["id"] == late["after"])
                r["submit"] = prev["finish"] - 0.5
        if not any("before" in b for b in check_run(broken, reqs)):
            fail("negative control: a turn submitted early was not noticed")
    print(f"PASS: traces deterministic; {len(reqs)} requests replayed in {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
