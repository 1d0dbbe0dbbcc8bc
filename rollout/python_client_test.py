"""End-to-end test of the Python client against `bitroll serve --engine null`.

Run by rollout/python_client_test.cc with /usr/bin/python3:
    python_client_test.py --bitroll PATH/bitroll --dump OUT.bin

For 1, 2 and 4 replicas, with another client loading the service concurrently, one group's
trajectories must be bit-identical (ids and fp32 logprob bytes) to an independent Python
re-derivation of NullEngine's documented formula (rollout/null_engine.h), and to each other.
The C++ side compares --dump with what the C++ client gets. Exit status 0 = pass.
"""

import argparse
import struct
import subprocess
import sys
import threading

import numpy as np

from bitroll import BitrollError, Client

M64 = (1 << 64) - 1
VOCAB, EOS_ID, EOS_PERIOD = 512, 2, 48  # NullEngineOptions defaults


def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def prompt_hash(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        u = t & 0xFFFFFFFF
        for b in range(4):
            h ^= (u >> (8 * b)) & 0xFF
            h = (h * 0x100000001B3) & M64
    return mix(h)


def expected(prompt, seed, sample, max_tokens, stop_ids=(), greedy=False):
    """NullEngine's output for one sample, derived independently of the C++ code."""
    ph = prompt_hash(prompt)
    ids, lps = [], []
    finish = "length"
    for k in range(max_tokens):
        pos = len(prompt) + k
        h = ph ^ mix((seed + 0x1234567) & M64) ^ mix((pos << 1) & M64)
        if not greedy:
            h ^= mix((sample * 2 + 1) & M64)
        h = mix(h)
        eos = k >= 1 and ((h >> 32) % EOS_PERIOD) == 0
        tok = EOS_ID if eos else 3 + h % (VOCAB - 3)
        ids.append(tok)
        lps.append(-np.float32(h >> 40) * np.float32(1.0 / 1048576.0))
        if eos:
            finish = "eos"
            break
        if tok in stop_ids:
            finish = "stop"
            break
    return np.array(ids, np.int32), np.array(lps, np.float32), finish


PROMPTS = [[5, 6, 7], [100, 200, 300, 400], [9]]
N, SEED, MAX_TOKENS, STOP = 8, 1234, 40, [77]


def serve(bitroll, replicas):
    p = subprocess.Popen([bitroll, "serve", "--engine", "null", "--replicas", str(replicas),
                          "--bind", "tcp://127.0.0.1:*", "--log-level", "warn"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("bitroll serve: clients "), line
    return p, line.split()[-1]


def load(endpoint, stop):
    c = Client(endpoint, timeout_ms=20000)
    gid = 1000
    while not stop.is_set():
        gid += 1
        c.submit([[10 + gid % 50, 11]], n=4, seed=gid, max_tokens=30, group_id=gid).result()
    c.close()


def check(cond, what):
    if not cond:
        print("FAIL:", what, flush=True)
        sys.exit(1)


def check_routing_parse():
    """Trajectory.routing of a wire Routing table: ids as uint8 (<= 256 experts) or uint16,
    weights as float32, both [positions, layers, k], every bit kept; None when absent."""
    import flatbuffers
    from bitroll import messages
    from bitroll.wire.Routing import RoutingT
    from bitroll.wire.Trajectory import Trajectory, TrajectoryT
    for experts, dtype in ((8, np.uint8), (300, np.uint16)):
        r = RoutingT()
        r.nLayers, r.k, r.nExperts = 2, 2, experts
        ids = [(i * 37 + 5) % experts for i in range(12)]
        w = (np.arange(12, dtype=np.float32) / np.float32(7)).astype(np.float32)
        if experts <= 256:
            r.idsU8 = ids
        else:
            r.idsU16 = ids
        r.weights = w.tolist()
        t = TrajectoryT()
        t.ids, t.logprobs, t.routing = [5, 6], [-1.0, -2.0], r
        b = flatbuffers.Builder(0)
        b.Finish(t.Pack(b))
        tr = messages.trajectory(Trajectory.GetRootAs(b.Output(), 0))
        check(tr.routing is not None and tr.routing["n_experts"] == experts, "routing parsed")
        check(tr.routing["expert_ids"].shape == (3, 2, 2), "routing shape")
        check(tr.routing["expert_ids"].dtype == dtype, f"routing id dtype {experts}")
        check(tr.routing["expert_ids"].reshape(-1).tolist() == ids, "routing ids")
        check(tr.routing["weights"].tobytes() == w.tobytes(), "routing weight bits")
        check('"routing"' in tr.to_json(), "routing in to_json")
        check("routing" in tr.audit_record([1]), "routing in the audit record")
    t = TrajectoryT()
    t.ids, t.logprobs = [5], [-1.0]
    b = flatbuffers.Builder(0)
    b.Finish(t.Pack(b))
    tr = messages.trajectory(Trajectory.GetRootAs(b.Output(), 0))
    check(tr.routing is None and '"routing"' not in tr.to_json(), "no routing when absent")


def main():
    check_routing_parse()
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitroll", required=True)
    ap.add_argument("--dump", required=True)
    a = ap.parse_args()
    runs = {}
    for replicas in (1, 2, 4):
        proc, ep = serve(a.bitroll, replicas)
        try:
            stop = threading.Event()
            bg = threading.Thread(target=load, args=(ep, stop), daemon=True)
            bg.start()
            c = Client(ep, timeout_ms=20000)
            group = c.submit(PROMPTS, n=N, params={"temperature": 1.0}, seed=SEED,
                             max_tokens=MAX_TOKENS, stop_ids=STOP, group_id=1, client_tag="py",
                             return_routing=True)
            trajs = group.result()
            check(len(trajs) == len(PROMPTS) * N, f"{len(trajs)} trajectories")
            check(group.summary["trajectories"] == 24 and group.summary["errors"] == 0,
                  f"summary {group.summary}")
            for t in trajs:
                ids, lps, finish = expected(PROMPTS[t.prompt_index], SEED, t.sample_index,
                                            MAX_TOKENS, STOP)
                check(t.ids.tobytes() == ids.tobytes(), f"ids {t.prompt_index}/{t.sample_index}")
                check(t.logprobs.tobytes() == lps.tobytes(),
                      f"logprob bits {t.prompt_index}/{t.sample_index}")
                check(t.finish == finish, f"finish {t.finish} != {finish}")
                check(t.client_tag == "py" and t.fingerprint["backend"] == "null", "tag/fp")
                check(t.routing is None, "a dense engine returns no routing")
            # Negative control: the comparison sees a changed seed.
            ids, lps, _ = expected(PROMPTS[0], SEED + 1, 0, MAX_TOKENS, STOP)
            check(trajs[0].logprobs.tobytes() != lps.tobytes(), "negative control")
            runs[replicas] = b"".join(struct.pack("<III", t.prompt_index, t.sample_index,
                                                  len(t.ids)) + t.ids.tobytes() +
                                      t.logprobs.tobytes() for t in trajs)
            # Typed errors keep the service up.
            try:
                c.submit([[1, 2]], n=10**9, group_id=2).result()
                check(False, "n=1e9 accepted")
            except BitrollError as e:
                check(e.code == "invalid_argument", e.code)
            try:
                c.submit([[1, VOCAB + 5]], n=1, group_id=3).result()
                check(False, "out-of-vocabulary id accepted")
            except BitrollError as e:
                check(e.code == "out_of_range", e.code)
            c.send_raw(b"\x00garbage")
            check(c.next_error().code == "protocol", "garbage -> protocol")
            check(c.update_weights("w7", 7, drain=True) == 7, "update_weights")
            st = c.status()
            check(len(st["replicas"]) == replicas and st["weight_version"] == 7, f"status {st}")
            check(not st["wal_enabled"] and st["wal_last_lsn"] == 0, f"no WAL: status {st}")
            try:
                c.wait_committed(2000)
                check(False, "wait_committed without a WAL returned")
            except BitrollError as e:
                check(e.code == "failed_precondition", e.code)
            stream = c.submit([[4, 4]], n=1, seed=5, max_tokens=10, group_id=4,
                              stream_tokens=True)
            t = stream.result()[0]
            got = np.concatenate([ch.ids for ch in stream.chunks])
            check(got.tobytes() == t.ids.tobytes() and t.versions == [(0, 7)], "streaming")
            stop.set()
            bg.join()
            c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    check(runs[1] == runs[2] == runs[4], "replica counts differ")
    with open(a.dump, "wb") as f:
        f.write(runs[1])
    print("python client: OK (replicas 1, 2, 4 bit-identical to the reference)")


if __name__ == "__main__":
    main()
