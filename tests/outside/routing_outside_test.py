"""Routing records (`return_routing`, docs/moe.md) driven from outside, as careless or hostile
clients would: only the `bitroll` CLI and the wire protocol.

A make-model MoE (qwen3-moe-tiny) is served with a WAL. Every check compares an innocent client's
routed group with `bitroll generate --json --routes` (ids, logprob bits, expert ids and weight
bits, all exact), after each of:
- a client that submits a large routed group (n = 64) and vanishes at once;
- a client that submits a routed, streamed group and never reads;
- a routed group at the model's context limit (max_tokens = the whole context);
- return_routing on a dense model: no routing record, the same tokens as without it.
Nothing may hang: every wait has a deadline, and the service must still serve at the end.

    /usr/bin/python3 tests/outside/routing_outside_test.py --bitroll build/rollout/bitroll
Exit 0 = pass, 1 = a check failed.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

np = oc.np
zmq = oc.zmq

PARAMS = {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
PROMPTS = [[1, 5, 9, 33, 7], [1, 200, 17]]


def generate(a, model, prompts, n, max_tokens, seed, tmp, routes=True):
    """`bitroll generate --json [--routes]` -> {(prompt, sample): (ids, bits, routing or None)}."""
    path = os.path.join(tmp, f"prompts_{seed}_{n}_{max_tokens}.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"ids": p}) + "\n")
    argv = [a.bitroll, "generate", "--model", model, "--prompts", path, "--json", "-n", str(n),
            "--max-tokens", str(max_tokens), "--temperature", repr(PARAMS["temperature"]),
            "--top-p", "1", "--seed", str(seed)] + (["--routes"] if routes else [])
    r = subprocess.run(argv, capture_output=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"generate failed: {r.stderr.decode(errors='replace')}")
    out = {}
    for line in r.stdout.decode().splitlines():
        j = json.loads(line)
        rt = j.get("routing")
        out[(j["prompt_index"], j["sample_index"])] = (
            list(j["ids"]), [int(b, 16) for b in j["logprob_bits"]],
            None if rt is None else (rt["shape"], rt["expert_ids"], rt["weight_bits"]))
    return out


def compare(t, ref, failures, label):
    want = ref.get((t.prompt_index, t.sample_index))
    if want is None:
        failures.append(f"{label}: unexpected trajectory {t.prompt_index}/{t.sample_index}")
        return
    if t.ids.tolist() != want[0]:
        failures.append(f"{label}: {t.prompt_index}/{t.sample_index}: ids differ from generate")
        return
    if t.logprobs.view(np.uint32).tolist() != want[1]:
        failures.append(f"{label}: {t.prompt_index}/{t.sample_index}: logprob bits differ")
    got = None
    if t.routing is not None:
        rj = oc.messages.routing_json(t.routing)
        got = (rj["shape"], rj["expert_ids"], rj["weight_bits"])
    if got != want[2]:
        failures.append(f"{label}: {t.prompt_index}/{t.sample_index}: routing differs "
                        f"(got {'none' if got is None else got[0]}, want "
                        f"{'none' if want[2] is None else want[2][0]})")


def run_group(srv, prompts, n, max_tokens, seed, failures, label, timeout_s=120, routes=True):
    try:
        with oc.bitroll.Client(srv.endpoint, timeout_ms=int(timeout_s * 1000)) as c:
            g = c.submit(prompts, n=n, params=PARAMS, seed=seed, max_tokens=max_tokens,
                         return_routing=routes)
            out = list(g)
    except Exception as e:
        failures.append(f"{label}: the group failed: {e}")
        return []
    if len(out) != len(prompts) * n:
        failures.append(f"{label}: {len(out)} trajectories, want {len(prompts) * n}")
    return out


def innocent(a, srv, model, tmp, refs, failures, label):
    t0 = time.time()
    for t in run_group(srv, PROMPTS, 3, 24, 5, failures, label):
        compare(t, refs, failures, label)
    if time.time() - t0 > a.innocent_s:
        failures.append(f"{label}: the innocent group took {time.time() - t0:.1f} s")
    if not srv.alive():
        failures.append(f"{label}: bitroll serve died:\n{srv.log_tail()}")


def main():
    ap = oc.standard_parser(__doc__)
    ap.add_argument("--innocent-s", type=float, default=60.0)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    failures = []
    with oc.TempDir("bitroll_routing_outside_") as tmp:
        moe = os.path.join(tmp, "moe")
        r = subprocess.run([a.bitroll, "make-model", "--shape", "qwen3-moe-tiny", "--out", moe],
                           capture_output=True, timeout=120)
        if r.returncode != 0:
            print(r.stderr.decode(errors="replace"))
            return 1
        with open(os.path.join(moe, "config.json")) as f:
            context = json.load(f)["max_position_embeddings"]
        refs = generate(a, moe, PROMPTS, 3, 24, 5, tmp)
        if any(v[2] is None for v in refs.values()):
            failures.append("generate --routes gave a record without routing")
        ctx = zmq.Context()
        srv = oc.Server(a.bitroll, moe, data_dir=os.path.join(tmp, "data"),
                        log=os.path.join(tmp, "serve.log"))
        srv.start()
        try:
            innocent(a, srv, moe, tmp, refs, failures, "plain")

            # A client that submits a big routed group and vanishes at once.
            with oc.bitroll.Client(srv.endpoint, context=ctx) as c:
                c.submit(PROMPTS, n=64, params=PARAMS, seed=9, max_tokens=256,
                         return_routing=True)
            innocent(a, srv, moe, tmp, refs, failures, "after a vanished routed client")

            # A client that asks for streamed routed tokens and never reads.
            lazy = oc.bitroll.Client(srv.endpoint, context=ctx)
            lazy._sock.setsockopt(zmq.RCVHWM, 1)
            lazy.submit(PROMPTS, n=32, params=PARAMS, seed=10, max_tokens=256,
                        return_routing=True, stream_tokens=True)
            innocent(a, srv, moe, tmp, refs, failures, "beside a routed client that never reads")
            lazy.close()

            # At the context limit: the whole context generated, every position routed.
            big = generate(a, moe, [PROMPTS[1]], 2, context, 12, tmp)
            for t in run_group(srv, [PROMPTS[1]], 2, context, 12, failures, "context limit"):
                compare(t, big, failures, "context limit")
                if t.routing is not None and t.routing["expert_ids"].shape[0] != \
                        len(PROMPTS[1]) + len(t.ids) - 1:
                    failures.append(f"context limit: {t.routing['expert_ids'].shape[0]} routed "
                                    f"positions for {len(PROMPTS[1]) + len(t.ids)} tokens")
            innocent(a, srv, moe, tmp, refs, failures, "at the end")
        finally:
            srv.kill9()

        # return_routing on a dense model: the same tokens as generate, no routing record.
        dense_refs = generate(a, a.model, PROMPTS, 2, 16, 3, tmp, routes=False)
        dsrv = oc.Server(a.bitroll, a.model, log=os.path.join(tmp, "dense.log"))
        dsrv.start()
        try:
            for t in run_group(dsrv, PROMPTS, 2, 16, 3, failures, "dense"):
                compare(t, dense_refs, failures, "dense model with return_routing")
        finally:
            dsrv.kill9()
        ctx.destroy(0)
    return oc.report("routing_outside_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
