"""The Python client against `bitroll serve` on a real model, checked against `bitroll generate`.

Run by tests/service_e2e_test.cc with /usr/bin/python3:
    service_e2e_client.py --bitroll PATH/bitroll --model stories260K.bin --prompts P.jsonl \
        --n 4 --seed S --max-tokens 64 --dump OUT.jsonl

The reference is `bitroll generate --json` (sampled: temperature 1, top-p 0.9; greedy: temperature
0 on text prompts). For 1, 2 and 4 replicas, while a second client keeps other groups in flight,
every trajectory the Python client receives must have the same ids and the same fp32 logprob bits
(exact hex) as the reference. A different seed must change them (negative control). The sampled
group's trajectories (1 replica) go to --dump as JSON Lines for the C++ side to compare.
Exit status 0 = pass.
"""

import argparse
import json
import os
import subprocess
import sys
import threading

import numpy as np

from bitroll import BitrollError, Client

GREEDY_TEXTS = ["The cat sat", "Once upon a time, there was a little dog"]
TIMEOUT_MS = 60000


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def generate(a, prompts_file, n, temperature, top_p, seed):
    """{(prompt, sample): (ids, bits hex, finish)} from `bitroll generate --json`."""
    out = subprocess.run([a.bitroll, "generate", "--model", a.model, "--prompts", prompts_file,
                          "-n", str(n), "--temperature", repr(temperature), "--top-p", repr(top_p),
                          "--seed", str(seed), "--max-tokens", str(a.max_tokens), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
    ref = {}
    for line in out.stdout.splitlines():
        j = json.loads(line)
        ref[(j["prompt_index"], j["sample_index"])] = (j["ids"], j["logprob_bits"], j["finish"])
    return ref


def key_of(t):
    bits = [f"{b:08x}" for b in t.logprobs.view(np.uint32).tolist()]
    return (t.ids.tolist(), bits, t.finish)


def compare(trajs, ref, what):
    if len(trajs) != len(ref):
        fail(f"{what}: {len(trajs)} trajectories, reference has {len(ref)}")
    for t in trajs:
        want = ref.get((t.prompt_index, t.sample_index))
        if want is None:
            fail(f"{what}: unexpected {t.prompt_index}/{t.sample_index}")
        got = key_of(t)
        if got != want:
            fail(f"{what}: {t.prompt_index}/{t.sample_index} differs: got {got[0][:8]} "
                 f"{got[1][:4]} {got[2]}, want {want[0][:8]} {want[1][:4]} {want[2]}")


def serve(a, replicas):
    p = subprocess.Popen([a.bitroll, "serve", "--model", a.model, "--replicas", str(replicas),
                          "--bind", "tcp://127.0.0.1:*", "--log-level", "warn"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("bitroll serve: clients "):
        p.kill()
        fail(f"bitroll serve did not start: {line!r}")
    return p, line.split()[-1]


def load(endpoint, prompts, stop, done, errors):
    """A second client: the first test prompt under other seeds, plus an unrelated prompt."""
    c = Client(endpoint, timeout_ms=TIMEOUT_MS)
    gid = 9000
    while not stop.is_set():
        gid += 1
        try:
            r = c.submit([prompts[0], [1, 10 + gid % 400, 42]], n=3,
                         params={"temperature": 1.0, "top_p": 0.95}, seed=gid, max_tokens=40,
                         group_id=gid).result()
            if len(r) == 6:
                done.append(gid)
            else:
                errors.append(f"{len(r)} trajectories")
        except BitrollError as e:
            errors.append(str(e))
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitroll", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help='JSONL of {"ids": [...]}')
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dump", required=True)
    a = ap.parse_args()

    with open(a.prompts) as f:
        prompts = [json.loads(line)["ids"] for line in f if line.strip()]
    greedy_file = a.dump + ".greedy_prompts.jsonl"
    with open(greedy_file, "w") as f:
        for t in GREEDY_TEXTS:
            f.write(json.dumps({"prompt": t}) + "\n")
    ref_sampled = generate(a, a.prompts, a.n, 1.0, 0.9, a.seed)
    ref_other = generate(a, a.prompts, a.n, 1.0, 0.9, a.seed + 1)
    ref_greedy = generate(a, greedy_file, 2, 0.0, 1.0, 7)
    os.remove(greedy_file)

    dumped = None
    for replicas in (1, 2, 4):
        proc, ep = serve(a, replicas)
        try:
            stop, done, errors = threading.Event(), [], []
            bg = threading.Thread(target=load, args=(ep, prompts, stop, done, errors),
                                  daemon=True)
            bg.start()
            c = Client(ep, timeout_ms=TIMEOUT_MS)
            for _ in range(3000):
                if done or errors:
                    break
                threading.Event().wait(0.01)
            if not done:
                fail(f"the background load never completed a group: {errors}")
            sampled = c.submit(prompts, n=a.n, params={"temperature": 1.0, "top_p": 0.9},
                               seed=a.seed, max_tokens=a.max_tokens, group_id=1,
                               client_tag="py-e2e").result()
            greedy = c.submit(GREEDY_TEXTS, n=2, params={"temperature": 0.0, "top_p": 1.0},
                              seed=7, max_tokens=a.max_tokens, group_id=2).result()
            stop.set()
            bg.join()
            c.close()
            if errors:
                fail(f"background load errors: {errors}")
            compare(sampled, ref_sampled, f"sampled, {replicas} replicas")
            compare(greedy, ref_greedy, f"greedy, {replicas} replicas")
            if any(t.client_tag != "py-e2e" or t.fingerprint.get("backend") != "cpu"
                   for t in sampled):
                fail("client tag / fingerprint backend")
            # Negative control: the comparison sees another seed.
            differ = sum(key_of(t) != ref_other[(t.prompt_index, t.sample_index)]
                         for t in sampled)
            if differ <= len(sampled) // 2:
                fail(f"negative control: only {differ} of {len(sampled)} differ under seed+1")
            replicas_used = {t.replica for t in sampled + greedy}
            print(f"replicas={replicas}: {len(sampled)} sampled + {len(greedy)} greedy "
                  f"trajectories identical to generate; served by {sorted(replicas_used)}; "
                  f"{len(done)} load groups; {differ} differ under seed+1", flush=True)
            if replicas == 1:
                dumped = sampled
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    with open(a.dump, "w") as f:
        for t in dumped:
            f.write(t.to_json() + "\n")
    print("python client: OK", flush=True)


if __name__ == "__main__":
    main()
