#!/usr/bin/env python3
"""Replays a regime trace (gen_trace.py) through `bitroll serve` and records what happened.

    run.py --bitroll build/rollout/bitroll --model DIR --trace chat.jsonl --out chat.json \\
        [--replicas 1] [--threads 1] [--config-key replica_capacity=8] \\
        [--serve-arg=--swa-cache=recompute ...]

Starts `bitroll serve --bind tcp://127.0.0.1:* --metrics-bind 127.0.0.1:0` (the --config file
holds --config-key entries; --serve-arg entries are passed as they are), then submits every
request of the trace through the Python client (bitroll.Client, PYTHONPATH=<build>/python) at
its arrival time, as one group of n samples with streamed tokens (stream_tokens), stop_at_eos off
(outputs are max_tokens long unless a sampled BOS ends them), temperature 1 and the request's
seed. A request with "after" is submitted think_s seconds after that request finished (never
before its t). A submit refused as busy (or any group error whose code is busy /
resource_exhausted / unavailable) is retried after 0.2 s, at most --retries times.

One event loop, one thread: between submits it waits on the client's socket and timestamps
each message as it arrives. Per request it records: submit, first token (the first TokenChunk
of any sample), finish (GroupDone), the tokens, the summed cost records of its trajectories
(prefill computed / cached, decode tokens, engine and queue seconds), retries, errors. Every
0.25 s it reads the service's status (queued, in flight, cache hit rate) and its Prometheus
/metrics (running and waiting sequences per replica); the counters of /metrics before and after
the run give the prefix-cache and token totals.

Output (--out): one JSON object {"config", "header", "wall_s", "requests": [...], "samples":
[...], "metrics_before", "metrics_after", "status_after", "serve_help_flags"}. Exit status 0
when every request finished (errors are recorded, not fatal), 1 when the service could not be
started or the replay timed out.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_trace  # noqa: E402  (this folder's trace generator)

from bitroll import BitrollError, Client  # noqa: E402
from bitroll import protocol as p  # noqa: E402
from bitroll.protocol import Message  # noqa: E402
from bitroll import messages  # noqa: E402

RETRY_CODES = ("busy", "resource_exhausted", "unavailable")
SAMPLE_EVERY_S = 0.25


def serve_flags(bitroll):
    """The long flags `bitroll serve --help` lists."""
    out = subprocess.run([bitroll, "serve", "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True).stdout
    return sorted(set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out)))


def start_serve(a, config_path):
    cmd = [a.bitroll, "serve", "--model", a.model, "--replicas", str(a.replicas), "--threads",
           str(a.threads), "--bind", "tcp://127.0.0.1:*", "--metrics-bind", "127.0.0.1:0",
           "--log-level", "warn", "--config", config_path]
    if not a.self_test:
        cmd.append("--skip-self-test")
    cmd += a.serve_arg
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    metrics = endpoint = None
    while endpoint is None:
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(f"bitroll serve exited ({proc.returncode}): {' '.join(cmd)}")
        if line.startswith("bitroll serve: metrics "):
            metrics = line.split()[-1]
        elif line.startswith("bitroll serve: clients "):
            endpoint = line.split()[-1]
    return proc, endpoint, metrics, cmd


def scrape(metrics):
    """{name{labels}: value} of the service's /metrics (empty when it cannot be read)."""
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def metric_sum(m, name):
    """The sum over labels of metric `name` in a scrape()."""
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


class Replay:
    def __init__(self, client, reqs, retries, t0):
        self.c, self.t0, self.retries = client, t0, retries
        self.reqs = {r["id"]: r for r in reqs}
        self.rec = {r["id"]: {"id": r["id"], "regime": r["regime"], "task": r["task"],
                              "turn": r["turn"], "prefix": r["prefix"],
                              "prefix_len": r["prefix_len"], "prompt_len": len(r["prompt"]),
                              "n": r["n"], "max_tokens": r["max_tokens"], "t": r["t"],
                              "submit": None, "first_token": None, "finish": None,
                              "tokens": 0, "trajectories": 0, "cost": {}, "retries": 0,
                              "errors": [], "finish_reasons": []} for r in reqs}
        self.ready_at = {r["id"]: r["t"] for r in reqs if r["after"] is None}
        self.waiting = {r["id"] for r in reqs if r["after"] is not None}
        self.inflight = {}  # id -> Group
        self.done = set()
        self.gid = 0

    def now(self):
        return time.monotonic() - self.t0

    def submit(self, rid):
        r, rec = self.reqs[rid], self.rec[rid]
        self.gid += 1
        g = self.c.submit([r["prompt"]], n=r["n"], params={"temperature": 1.0}, seed=r["seed"],
                          max_tokens=r["max_tokens"], group_id=self.gid, stop_at_eos=False,
                          stream_tokens=True, client_tag=r["regime"])
        if rec["submit"] is None:
            rec["submit"] = self.now()
        self.inflight[rid] = g

    def due(self):
        """Submits every request whose time has come; returns the next due time (or None)."""
        now = self.now()
        for rid, t in sorted(self.ready_at.items(), key=lambda kv: kv[1]):
            if t <= now:
                del self.ready_at[rid]
                self.submit(rid)
        return min(self.ready_at.values()) if self.ready_at else None

    def finished(self, rid, at):
        rec = self.rec[rid]
        rec["finish"] = at
        self.done.add(rid)
        for w in list(self.waiting):
            r = self.reqs[w]
            if r["after"] == rid:
                self.waiting.discard(w)
                self.ready_at[w] = max(r["t"], at + r["think_s"])

    def collect(self, at):
        """Moves what the client received into the records (at: the receive time)."""
        for rid, g in list(self.inflight.items()):
            rec = self.rec[rid]
            if g.chunks and rec["first_token"] is None:
                rec["first_token"] = at
            g.chunks.clear()
            retry = False
            while g._events:
                kind, v = g._events.popleft()
                if kind == "trajectory":
                    rec["trajectories"] += 1
                    rec["tokens"] += len(v.ids)
                    rec["finish_reasons"].append(v.finish)
                    for k, x in v.cost.items():
                        rec["cost"][k] = rec["cost"].get(k, 0.0) + x
                    if rec["first_token"] is None and len(v.ids):
                        rec["first_token"] = at
                else:
                    rec["errors"].append(f"{v.code}: {v.message}")
                    retry = v.code in RETRY_CODES and rec["retries"] < self.retries
                    g._done = True
            if g._done:
                del self.inflight[rid]
                if retry:
                    rec["retries"] += 1
                    self.ready_at[rid] = at + 0.2
                else:
                    self.finished(rid, at)

    def pending(self):
        return len(self.done) < len(self.reqs)


def run(a):
    header, reqs = gen_trace.load(a.trace)
    flags = serve_flags(a.bitroll)
    config = {}
    for kv in a.config_key:
        k, _, v = kv.partition("=")
        config[k] = json.loads(v)
    with tempfile.TemporaryDirectory(prefix="regimes-") as tmp:
        cfg = os.path.join(tmp, "serve.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        t_start = time.monotonic()
        proc, endpoint, metrics, cmd = start_serve(a, cfg)
        startup_s = time.monotonic() - t_start
        try:
            return replay(a, header, reqs, flags, config, proc, endpoint, metrics, cmd,
                          startup_s)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def replay(a, header, reqs, flags, config, proc, endpoint, metrics, cmd, startup_s):
    client = Client(endpoint, timeout_ms=a.timeout * 1000)
    # Wait until the service answers (status), then read the counters before the run.
    client.status()
    load_begin = os.getloadavg()[0]
    before = scrape(metrics) if metrics else {}
    t0 = time.monotonic()
    rp = Replay(client, reqs, a.retries, t0)
    samples, status_rid, next_sample, ok = [], None, 0.0, True
    sock = client._sock
    while rp.pending():
        now = rp.now()
        if now > a.timeout:
            ok = False
            print(f"run.py: timeout after {a.timeout} s with {len(rp.inflight)} in flight",
                  file=sys.stderr)
            break
        try:
            nxt = rp.due()
        except BitrollError as e:
            print(f"run.py: submit failed: {e}", file=sys.stderr)
            ok = False
            break
        if now >= next_sample:
            s = {"t": now, "inflight_requests": len(rp.inflight)}
            if metrics:
                m = scrape(metrics)
                s["running"] = metric_sum(m, "bitroll_replica_running")
                s["waiting"] = metric_sum(m, "bitroll_replica_waiting")
            samples.append(s)
            if status_rid is None:
                status_rid = client._send(Message.Status, p.StatusT())
            next_sample = now + SAMPLE_EVERY_S
        wait = next_sample - rp.now()
        if nxt is not None:
            wait = min(wait, nxt - rp.now())
        if sock.poll(max(0, int(wait * 1000))):
            while sock.poll(0):
                client._pump(0)
            rp.collect(rp.now())
        if status_rid is not None and status_rid in client._replies:
            env = client._replies.pop(status_rid)
            status_rid = None
            if not isinstance(env, BitrollError):
                st = messages.status_reply(messages.table(env, p.StatusReply))
                samples[-1].update({"queued": st["queued"], "inflight": st["inflight"],
                                    "cache_hit_rate": st["cache_hit_rate"]})
        if proc.poll() is not None:
            print(f"run.py: bitroll serve exited ({proc.returncode})", file=sys.stderr)
            ok = False
            break
    wall = rp.now()
    if status_rid is not None:  # the last status request may still be on its way
        try:
            while status_rid not in client._replies and sock.poll(2000):
                client._pump(0)
            client._replies.pop(status_rid, None)
        except BitrollError:
            pass
    status_after = client.status() if ok else None
    after = scrape(metrics) if metrics else {}
    client.close()
    result = {"config": {"replicas": a.replicas, "threads": a.threads, "config": config,
                         "serve_args": a.serve_arg, "command": cmd[:1] + cmd[1:],
                         "startup_s": startup_s,
                         "loadavg": [load_begin, os.getloadavg()[0]]},
              "header": header, "wall_s": wall, "ok": ok,
              "requests": list(rp.rec.values()), "samples": samples,
              "metrics_before": before, "metrics_after": after, "status_after": status_after,
              "serve_help_flags": flags}
    return result, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config-key", action="append", default=[],
                    help="KEY=JSON for serve's --config file, e.g. replica_capacity=8")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra `bitroll serve` argument, e.g. --serve-arg=--swa-cache=full")
    ap.add_argument("--retries", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600, help="seconds for the whole replay")
    ap.add_argument("--self-test", action="store_true",
                    help="run serve's start-up self-test (skipped by default: not measured)")
    a = ap.parse_args()
    try:
        result, ok = run(a)
    except (RuntimeError, BitrollError, zmq.ZMQError, ValueError) as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 1
    with open(a.out, "w") as f:
        json.dump(result, f)
    reqs = result["requests"]
    done = sum(1 for r in reqs if r["finish"] is not None and not r["errors"])
    print(f"run.py: {os.path.basename(a.trace)}: {done}/{len(reqs)} requests in "
          f"{result['wall_s']:.1f} s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
