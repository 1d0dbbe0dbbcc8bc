"""`bitroll audit` end to end (issue 14, docs/audit.md), through the CLI and the wire protocol.

  1. records of `bitroll generate --json` (3 prompts, n=3, temperature 0.8) audit clean in both
     modes (exit 0);
  2. each tampering is caught with the right verdict and position: one flipped logprob bit, one
     changed id, a swapped sample index and a changed seed (rerun; rescore cannot see the noise
     and says identical, as documented), a record made with other weights (bitroll make-model),
     a changed fingerprint, every required field removed in turn, a line that is not JSON, an
     edited tool result and a changed injected token (in the service records of 4); the
     exit status is 1 with a divergence, 2 when something could not be audited;
  3. a record made with the widest ISA this CPU has audits clean with the narrower ones;
  4. a `bitroll serve --data-dir` service (a plain group, a multi-turn group with a tool, a group
     resumed after kill -9, a group left unfinished by a last kill -9): `bitroll audit export`
     equals what the client received, and `bitroll audit --data-dir` is clean in both modes;
  5. weights by version: a service whose weights change (a path update) while a long group runs;
     its weights.jsonl names both versions' files and hashes; records written by the Python
     client (Trajectory.audit_record) audit clean in both modes through the registry without
     --model, and --connect passes them while refusing a changed hash or kernel version; without
     the registry the version-1 records are weights_unavailable (negative control); the data
     directory audits clean except the records spanning both versions (multi-version, named);
     the version-1 file replaced, then removed: its records are refused with its hash.

Run: python3 tests/audit/audit_test.py --bitroll build/rollout/bitroll [--model M]
"""

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "outside"))
import outside_common as oc  # noqa: E402

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("  FAIL: " + what)
    return cond


def run(argv, timeout=300):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Ctx:
    def __init__(self, a, tmp):
        self.bitroll, self.model, self.tmp = a.bitroll, a.model, tmp
        self.n_files = 0

    def generate(self, extra, model=None):
        argv = [self.bitroll, "generate", "--model", model or self.model, "--json"] + extra
        rc, out, err = run(argv)
        if rc != 0:
            raise RuntimeError(f"generate failed ({rc}): {' '.join(argv)}\n{err}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def write(self, records, raw_lines=()):
        self.n_files += 1
        path = os.path.join(self.tmp, f"records{self.n_files}.jsonl")
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
            for line in raw_lines:
                f.write(line + "\n")
        return path

    def audit(self, source, mode, extra=(), model=None):
        """(exit status, parsed --json output) of `bitroll audit`."""
        src = ["--data-dir", source] if os.path.isdir(source) else [source]
        # model "": no --model (the weights registry names the files)
        m = [] if model == "" else ["--model", model or self.model]
        argv = [self.bitroll, "audit"] + src + m + ["--mode", mode, "--json"] + list(extra)
        rc, out, err = run(argv)
        try:
            return rc, json.loads(out)
        except ValueError:
            raise RuntimeError(f"audit printed no JSON ({rc}): {' '.join(argv)}\n{out}\n{err}")


def verdicts(j):
    return [v["verdict"] for v in j["verdicts"]]


def all_identical(name, rc, j, n):
    check(rc == 0, f"{name}: exit status {rc}, want 0")
    check(len(j["verdicts"]) == n, f"{name}: {len(j['verdicts'])} verdicts, want {n}")
    bad = [v for v in j["verdicts"] if v["verdict"] != "identical"]
    check(not bad, f"{name}: not identical: {bad[:2]}")


def expect_one(name, rc, j, index, verdict, want_rc, token=None):
    """Record `index` has `verdict` (at `token`), every other one is identical."""
    v = j["verdicts"][index]
    ok = check(v["verdict"] == verdict, f"{name}: record {index} is {v['verdict']} "
               f"({v.get('detail')}), want {verdict}")
    if ok and token is not None:
        check(v["divergence"]["token"] == token,
              f"{name}: diverged at token {v['divergence']['token']}, want {token}")
    others = [w for k, w in enumerate(j["verdicts"]) if k != index and w["verdict"] != "identical"]
    check(not others, f"{name}: other records not identical: {others[:2]}")
    check(rc == want_rc, f"{name}: exit status {rc}, want {want_rc}")
    return v


def first_difference(a, b):
    for k in range(min(len(a), len(b))):
        if a[k] != b[k]:
            return k
    return None


def test_generate_and_tampering(c):
    print("[1] generate --json records audit clean; [2] tampering is caught")
    prompts = os.path.join(c.tmp, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write('"Once upon a time"\n"The little dog"\n{"ids": [1, 403, 407, 261]}\n')
    gen = ["--prompts", prompts, "-n", "3", "--temperature", "0.8", "--top-p", "0.95",
           "--seed", "1234", "--max-tokens", "64"]
    recs = c.generate(gen)
    check(len(recs) == 9, f"generate gave {len(recs)} records, want 9")
    for k in ("record_version", "bitroll_version", "prompt_ids", "ids", "mask", "logprob_bits",
              "sampling", "seed", "sample_index", "weight_versions", "fingerprint", "turn_begins"):
        check(k in recs[0], f"generate --json lacks {k}")
    clean = c.write(recs)
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(clean, mode)
        all_identical(f"clean {mode}", rc, j, 9)

    # One flipped logprob bit (the lowest: 1 ULP).
    t = 10
    r = copy.deepcopy(recs)
    r[4]["logprob_bits"][t] = "%08x" % (int(r[4]["logprob_bits"][t], 16) ^ 1)
    path = c.write(r)
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(path, mode)
        v = expect_one(f"flipped bit ({mode})", rc, j, 4, "diverged", 1, token=t)
        if v["verdict"] == "diverged":
            check(v["divergence"]["ulps"] == 1, f"flipped bit ({mode}): {v['divergence']['ulps']}"
                  " ULPs, want 1")
            check(v["divergence"]["recomputed_bits"] == recs[4]["logprob_bits"][t],
                  f"flipped bit ({mode}): recomputed bits are not the original ones")

    # One changed id.
    t = 3
    r = copy.deepcopy(recs)
    orig = r[2]["ids"][t]
    r[2]["ids"][t] = (orig + 7) % 512
    path = c.write(r)
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(path, mode)
        v = expect_one(f"changed id ({mode})", rc, j, 2, "diverged", 1, token=t)
        if mode == "rerun" and v["verdict"] == "diverged":
            check(v["divergence"]["recomputed_id"] == orig,
                  f"changed id (rerun): recomputed id {v['divergence']['recomputed_id']}, "
                  f"want the original {orig}")
        if v["verdict"] == "diverged":
            top5 = [a["id"] for a in v["divergence"].get("top5", [])]
            check(len(top5) == 5 and (mode == "rescore" or orig in top5),
                  f"changed id ({mode}): top-5 alternatives {top5} (the sampled {orig} among "
                  "them in rerun)")

    # A swapped sample index (samples 0 and 1 of prompt 0).
    r = copy.deepcopy(recs)
    r[0]["sample_index"], r[1]["sample_index"] = r[1]["sample_index"], r[0]["sample_index"]
    d = first_difference(recs[0]["ids"], recs[1]["ids"])
    path = c.write(r)
    rc, j = c.audit(path, "rerun")
    if check(d is not None, "samples 0 and 1 are identical: the swap test cannot see it"):
        for k in (0, 1):
            v = j["verdicts"][k]
            if check(v["verdict"] == "diverged", f"swapped sample index: record {k} is "
                     f"{v['verdict']}, want diverged"):
                check(v["divergence"]["token"] == d, f"swapped sample index: record {k} "
                      f"diverged at {v['divergence']['token']}, want {d}")
        check(rc == 1, f"swapped sample index: exit status {rc}, want 1")
    rc, j = c.audit(path, "rescore")
    all_identical("swapped sample index (rescore: logprobs do not depend on the noise)", rc, j, 9)

    # A changed seed: the divergence is where generate with that seed first differs.
    r = copy.deepcopy(recs)
    r[0]["seed"] = "1235"
    other = c.generate(gen[:-4] + ["--seed", "1235", "--max-tokens", "64"])
    d = first_difference(recs[0]["ids"], other[0]["ids"])
    path = c.write(r)
    rc, j = c.audit(path, "rerun")
    if check(d is not None, "seeds 1234 and 1235 gave the same ids: the seed test cannot see it"):
        expect_one("changed seed (rerun)", rc, j, 0, "diverged", 1, token=d)

    # A record made with other weights.
    mm = os.path.join(c.tmp, "other_model")
    rc, _, err = run([c.bitroll, "make-model", "--shape", "stories260k", "--seed", "7",
                      "--out", mm])
    if check(rc == 0, f"make-model failed: {err}"):
        other_model = os.path.join(mm, "model.bin")
        foreign = c.generate(["--prompt", "Once upon a time", "-n", "2", "--max-tokens", "16",
                              "--tokenizer", os.path.join(mm, "tokenizer.bin")],
                             model=other_model)
        path = c.write(recs[:3] + foreign)
        rc, j = c.audit(path, "rescore")
        check(verdicts(j) == ["identical"] * 3 + ["weights_unavailable"] * 2,
              f"other weights: verdicts {verdicts(j)}")
        check(rc == 2, f"other weights: exit status {rc}, want 2")
        rc, j = c.audit(c.write(foreign), "rerun", model=other_model)
        all_identical("other weights audited with their own model (control)", rc, j, 2)

    # A changed fingerprint (another kernel version).
    r = copy.deepcopy(recs)
    r[6]["fingerprint"]["kernel_version"] += 1
    rc, j = c.audit(c.write(r), "rescore")
    expect_one("changed fingerprint", rc, j, 6, "fingerprint_mismatch", 2)

    # Records of another fingerprint (bf16 matmul weights): a mismatch on the f32 engine, clean
    # on the bf16 one.
    bf16 = c.write(c.generate(["--prompt", "Once upon a time", "-n", "2", "--temperature", "0.8",
                               "--max-tokens", "32", "--weights", "bf16"]))
    rc, j = c.audit(bf16, "rescore")
    check(rc == 2 and verdicts(j) == ["fingerprint_mismatch"] * 2,
          f"bf16 records on f32: exit status {rc}, verdicts {verdicts(j)}")
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(bf16, mode, extra=["--weights", "bf16"])
        all_identical(f"bf16 records with --weights bf16 ({mode})", rc, j, 2)
    # --tolerance: the same bf16 records on the f32 engine, reported by value and labelled.
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(bf16, mode, extra=["--tolerance"])
        tol = [v.get("tolerance") or {} for v in j["verdicts"]]
        check(rc == 2 and verdicts(j) == ["tolerance_report"] * 2 and
              all(t.get("bitwise") is False and t.get("max_abs_logprob_diff", 0) > 0 and
                  t.get("compared", 0) > 0 for t in tol) and
              "NOT BITWISE" in j["verdicts"][0].get("detail", ""),
              f"bf16 records with --tolerance ({mode}): exit {rc}, {verdicts(j)}, {tol}")
    rc, j = c.audit(clean, "rescore", extra=["--tolerance"])
    all_identical("--tolerance leaves same-fingerprint records bitwise", rc, j, 9)

    # Every required field removed in turn, and a line that is not JSON.
    required = ["record_version", "sample_index", "prompt_ids", "ids", "mask", "logprob_bits",
                "sampling", "seed", "weight_versions", "fingerprint"]
    r = []
    for k, field in enumerate(required):
        x = copy.deepcopy(recs[k % len(recs)])
        del x[field]
        r.append(x)
    r.append(recs[0])
    rc, j = c.audit(c.write(r, raw_lines=['{"record_version": 1, "ids": [1, 2']), "rescore")
    for k, field in enumerate(required):
        v = j["verdicts"][k]
        check(v["verdict"] == "incomplete" and f"missing {field}" in v.get("detail", ""),
              f"removed {field}: {v['verdict']} ({v.get('detail')}), want incomplete: missing")
    check(j["verdicts"][len(required)]["verdict"] == "identical",
          "the intact record among incomplete ones is not identical")
    check(j["verdicts"][-1]["verdict"] == "incomplete", "a line that is not JSON is not incomplete")
    check(rc == 2, f"removed fields: exit status {rc}, want 2")

    # A divergence and an incomplete record together: exit status 1.
    r = copy.deepcopy(recs)
    r[1]["logprob_bits"][0] = "00000000"
    del r[2]["seed"]
    rc, j = c.audit(c.write(r), "rescore")
    check(rc == 1 and verdicts(j)[1] == "diverged" and verdicts(j)[2] == "incomplete",
          f"mixed: exit status {rc}, verdicts {verdicts(j)[:3]}")


def cpu_isas():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    isas = ["scalar"]
    if "avx2" in flags and "fma" in flags:
        isas.append("avx2")
    if "avx512f" in flags:
        isas.append("avx512")
    return isas


def test_isa(c):
    isas = cpu_isas()
    print(f"[3] a record made with --isa {isas[-1]} audits with {isas[:-1]}")
    recs = c.generate(["--prompt", "Once upon a time", "-n", "4", "--temperature", "0.9",
                       "--max-tokens", "96", "--isa", isas[-1]])
    path = c.write(recs)
    for isa in isas[:-1]:
        for mode in ("rescore", "rerun"):
            rc, j = c.audit(path, mode, extra=["--isa", isa])
            all_identical(f"--isa {isas[-1]} record audited with --isa {isa} ({mode})", rc, j, 4)


def traj_key(t):
    return (t.group_id, t.prompt_index, t.sample_index)


def dir_digest(d):
    """sha256 of every file's bytes under d (LMDB's lock file excluded: readers may write it)."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(os.listdir(d)):
        if name == "lock.mdb":
            continue
        h.update(name.encode())
        with open(os.path.join(d, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def wait_for_tokens(client, group, n, timeout=60.0):
    """Reads the group's streamed chunks until n tokens arrived (then the caller kills)."""
    deadline = time.time() + timeout
    while sum(len(ch.ids) for ch in group.chunks) < n and time.time() < deadline:
        client._pump(1000)


def test_service(c, trajectories):
    print("[4] a service data directory (plain, multi-turn with a tool, kill -9 + resume, "
          "unfinished) audits clean")
    data = os.path.join(c.tmp, "data")
    srv = oc.Server(c.bitroll, c.model, data_dir=data, replicas=2).start()
    cid = "audit-test-client"
    got = {}
    cl = oc.bitroll.Client(srv.endpoint, timeout_ms=60000, client_id=cid)
    plain = cl.submit([[1, 403, 407], [1, 10, 20, 30]], n=4, params={"temperature": 0.9},
                      seed=11, max_tokens=64, group_id=1)
    for t in plain.result():
        got[traj_key(t)] = t
    tools = cl.submit(["Once upon a time"], n=6, params={"temperature": 0.9}, seed=5,
                      max_tokens=96, max_turns=4, group_id=2,
                      tools=[{"name": "echo", "function": "echo"}], tool_open=" was",
                      tool_close=".")
    multi = 0
    for t in tools.result():
        got[traj_key(t)] = t
        multi += 1 if t.turns > 1 else 0
    check(multi > 0, "no trajectory of the tool group made a tool call (no multi-turn coverage)")
    # --trajectories N: more plain groups (16 trajectories each) until the service made N.
    extra, gid = 0, 100
    while 8 + 6 + 24 + 8 + extra < trajectories:
        g = cl.submit([[1, 10 + gid % 50, 20], [1, 30, 40 + gid % 50]], n=8,
                      params={"temperature": 0.9, "top_p": 0.95}, seed=gid, max_tokens=48,
                      group_id=gid)
        for t in g.result():
            got[traj_key(t)] = t
        extra += 16
        gid += 1
    # A long group killed part-way, then resumed from the WAL.
    long_prompts = [[1, 10 + p, 20 + p, 30] for p in range(6)]
    g = cl.submit(long_prompts, n=4, params={"temperature": 0.8}, seed=77, max_tokens=400,
                  stop_at_eos=False, group_id=3, stream_tokens=True)
    wait_for_tokens(cl, g, 1000)  # of 9,600
    srv.kill9()
    cl.close()
    srv.start()
    cl = oc.bitroll.Client(srv.endpoint, timeout_ms=120000, client_id=cid)
    resumed = cl.submit(long_prompts, n=4, params={"temperature": 0.8}, seed=77, max_tokens=400,
                        stop_at_eos=False, group_id=3)
    for t in resumed.result():
        got[traj_key(t)] = t
    rec = re.findall(r"(\d+) unfinished trajectories \((\d+) logged tokens\)",
                     open(srv.log, errors="replace").read())
    check(rec and int(rec[-1][0]) > 0 and int(rec[-1][1]) > 0,
          f"the kill -9 did not land mid-group (recovery said {rec[-1:] or 'nothing'})")
    # A group left unfinished by the last kill -9.
    g = cl.submit([[1, 50, 60, 70]], n=8, params={"temperature": 1.0}, seed=9, max_tokens=480,
                  stop_at_eos=False, group_id=4, stream_tokens=True)
    wait_for_tokens(cl, g, 400)  # of 3,840
    srv.kill9()
    cl.close()

    before = dir_digest(data)
    rc, out, err = run([c.bitroll, "audit", "export", "--data-dir", data])
    check(rc == 0, f"audit export: exit status {rc}: {err}")
    recs = [json.loads(line) for line in out.splitlines() if line.strip()]
    by_key = {(r["group_id"], r["prompt_index"], r["sample_index"]): r for r in recs}
    want = 8 + 6 + 24 + extra
    check(len([k for k in by_key if k[0] != 4]) == want,
          f"export holds {len(by_key)} records, want {want} of groups 1-3 and those of group 4")
    unfinished = sum(1 for r in recs if r["finish"] == "unfinished")
    injected = sum(1 for r in recs if 0 in r["mask"])
    print(f"  exported {len(recs)} records: {unfinished} unfinished, {injected} with injected "
          f"tool results; the restart resumed {rec[-1:]} (trajectories, logged tokens)")
    for k, t in got.items():
        r = by_key.get(k)
        if not check(r is not None, f"export lacks trajectory {k}"):
            continue
        bits = ["%08x" % b for b in t.logprobs.view(oc.np.uint32).tolist()]
        mask = [] if t.mask is None else t.mask.tolist()
        rb = [b if m else "00000000" for b, m in zip(r["logprob_bits"], r["mask"])]
        tb = [b if (not mask or mask[i]) else "00000000" for i, b in enumerate(bits)]
        check(r["ids"] == t.ids.tolist() and rb == tb,
              f"exported trajectory {k} differs from what the client received")
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(data, mode)
        all_identical(f"data directory ({mode})", rc, j, len(recs))
        print(f"  audit --data-dir {mode}: {j['trajectories']} trajectories, "
              f"{j['tokens_checked']} tokens in {j['engine_seconds']:.2f} s of engine time "
              f"({j['tokens_per_second']:.0f} tok/s), exit {rc}")
    check(dir_digest(data) == before, "audit export or audit --data-dir changed the data directory")
    # A tool result edited (its stdout), and an injected token changed: both caught at the
    # injected tokens of the turn the result opens, in both modes.
    k = next((i for i, r in enumerate(recs) if 0 in r["mask"] and r["tool_calls"]
              and r["tool_calls"][0]["result"] is not None), None)
    if check(k is not None, "no exported record has an injected tool result"):
        begin = recs[k]["turn_begins"][1]
        end = begin
        while end < len(recs[k]["mask"]) and recs[k]["mask"][end] == 0:
            end += 1
        r = copy.deepcopy(recs)
        r[k]["tool_calls"][0]["result"]["stdout"] = "tampered " + \
            r[k]["tool_calls"][0]["result"]["stdout"]
        r2 = copy.deepcopy(recs)
        r2[k]["ids"][end - 1] = (r2[k]["ids"][end - 1] + 1) % 512
        for name, rr, at in (("edited tool result", r, None), ("changed injected id", r2, end - 1)):
            path = c.write(rr)
            for mode in ("rescore", "rerun"):
                rc, j = c.audit(path, mode)
                v = expect_one(f"{name} ({mode})", rc, j, k, "diverged", 1, token=at)
                if v["verdict"] == "diverged":
                    t = v["divergence"]["token"]
                    check(begin <= t < end and "tool result" in v["divergence"].get("what", ""),
                          f"{name} ({mode}): diverged at {t} ({v['detail']}), want an injected "
                          f"token in [{begin}, {end}) named as a tool result")

    # Negative control: the same export with one flipped bit in a resumed trajectory.
    k = next(i for i, r in enumerate(recs) if r["group_id"] == 3)
    r = copy.deepcopy(recs)
    r[k]["logprob_bits"][300] = "%08x" % (int(r[k]["logprob_bits"][300], 16) ^ 0x10)
    rc, j = c.audit(c.write(r), "rescore")
    expect_one("exported records with one flipped bit", rc, j, k, "diverged", 1, token=300)


def test_weights_versions(c):
    print("[5] weights by version: a path update mid-run; records of the Python client audit "
          "through the data directory's weights.jsonl; a replaced file is refused")
    data = os.path.join(c.tmp, "data_versions")
    wdir = os.path.join(c.tmp, "weights")
    rc, _, err = run([c.bitroll, "make-model", "--shape", "stories260k", "--seed", "7",
                      "--out", wdir])
    if not check(rc == 0, f"make-model failed: {err}"):
        return
    v1 = os.path.join(wdir, "model.bin")
    srv = oc.Server(c.bitroll, c.model, data_dir=data, replicas=1).start()
    cl = oc.bitroll.Client(srv.endpoint, timeout_ms=60000, client_id="audit-versions")
    req = dict(params={"temperature": 0.9, "top_p": 0.95}, seed=21, max_tokens=40)
    prompts = [[1, 403, 407], [1, 10, 20, 30]]
    a = cl.submit(prompts, n=3, group_id=1, **req).result()  # version 0
    # A long group running while version 1 goes live (no drain): its trajectories span both.
    lreq = dict(params={"temperature": 0.9}, seed=5, max_tokens=480, stop_at_eos=False)
    lprompts = [[1, 50, 60], [1, 70, 80]]
    lg = cl.submit(lprompts, n=16, group_id=2, stream_tokens=True, **lreq)
    wait_for_tokens(cl, lg, 200)  # of 15,360
    check(cl.update_weights(v1, 1) == 1, "update_weights did not make version 1 live")
    long_ = lg.result()
    b = cl.submit(prompts, n=3, group_id=3, **req).result()  # version 1
    # --connect: records checked against the running service's fingerprint and live weights.
    recs = [t.audit_record(prompts[t.prompt_index], **req) for t in a + b]
    registry = ["--weights-registry", os.path.join(data, "weights.jsonl")]
    connect = ["--connect", srv.endpoint]
    rc, j = c.audit(c.write(recs), "rescore", extra=registry + connect, model="")
    all_identical("--connect, records of versions 0 and 1", rc, j, len(recs))
    bad = copy.deepcopy(recs)
    bad[len(a)]["fingerprint"]["weights_hash"] = recs[0]["fingerprint"]["weights_hash"]
    bad[0]["fingerprint"]["kernel_version"] += 1
    rc, j = c.audit(c.write(bad), "rescore", extra=registry + connect, model="")
    fa, fb = j["verdicts"][0], j["verdicts"][len(a)]
    check(rc == 2 and fa["verdict"] == "fingerprint_mismatch" and "the service at" in fa["detail"]
          and fb["verdict"] == "weights_unavailable" and
          f"the service at {srv.endpoint} serves version 1 with weights" in fb["detail"],
          f"--connect: exit {rc}, {fa.get('detail')} / {fb.get('detail')}")
    print(f"  --connect: {fb.get('detail')}")
    srv.kill9()
    cl.close()
    reg = [json.loads(line) for line in open(os.path.join(data, "weights.jsonl"))]
    print(f"  weights.jsonl: {[(e['version'], e['source'], e['weights_hash']) for e in reg]}")
    hash_of = lambda t: f"{t.fingerprint['weights_hash']:016x}"  # noqa: E731
    check([e["version"] for e in reg] == [0, 1] and reg[1]["path"] == os.path.abspath(v1)
          and reg[0]["weights_hash"] == hash_of(a[0]) and reg[1]["weights_hash"] == hash_of(b[0])
          and hash_of(a[0]) != hash_of(b[0]),
          f"weights.jsonl does not hold version 0 and the path of version 1 with their hashes: "
          f"{reg}")
    multi = sum(1 for t in long_ if len({v for _, v in t.versions}) > 1)
    check(multi > 0, f"no trajectory of the long group spans two versions: "
          f"{[t.versions for t in long_]}")

    path = c.write(recs)
    for mode in ("rescore", "rerun"):
        rc, j = c.audit(path, mode, extra=registry, model="")
        all_identical(f"Python client records of versions 0 and 1 ({mode})", rc, j, len(recs))
    # Negative control: without the registry, --model holds version 0 only.
    rc, j = c.audit(path, "rescore")
    bad = [k for k, v in enumerate(j["verdicts"]) if v["verdict"] == "weights_unavailable"]
    check(rc == 2 and bad == list(range(len(a), len(recs))),
          f"without the registry: exit {rc}, weights_unavailable at {bad}, want the version-1 "
          f"records {list(range(len(a), len(recs)))}")
    # The data directory (its weights.jsonl found there): version 0 and 1 clean, the records
    # spanning both refused as multi-version, naming both files.
    rc, j = c.audit(data, "rescore", model="")
    vs = j["verdicts"]
    mv = [v for v in vs if v["verdict"] == "weights_unavailable"]
    check(rc == 2 and len(mv) == multi and all("multi-version record needs" in v["detail"]
                                                 and v1 in v["detail"] for v in mv)
          and all(v["verdict"] == "identical" for v in vs if v not in mv),
          f"audit --data-dir with weights versions: exit {rc}, {[v['detail'] for v in mv][:1]}, "
          f"{[v['verdict'] for v in vs]}")
    print(f"  multi-version: {mv[0]['detail'] if mv else None}")
    # The file of version 1 replaced by other weights: its records are refused, naming it.
    rc, _, err = run([c.bitroll, "make-model", "--shape", "stories260k", "--seed", "8",
                      "--out", wdir])
    check(rc == 0, f"make-model failed: {err}")
    rc, j = c.audit(path, "rescore", extra=registry, model="")
    want = (f"weights unavailable: version 1 was {os.path.abspath(v1)} (hash {reg[1]['weights_hash']}), "
            f"file now hashes ")
    vs = j["verdicts"]
    check(rc == 2 and all(v["verdict"] == "identical" for v in vs[:len(a)])
          and all(v["verdict"] == "weights_unavailable" and v["detail"].startswith(want)
                  for v in vs[len(a):]),
          f"replaced version-1 file: exit {rc}, {[(v['verdict'], v.get('detail')) for v in vs][-1:]}")
    print(f"  replaced file: {vs[-1].get('detail')}")
    os.remove(v1)
    rc, j = c.audit(path, "rescore", extra=registry, model="")
    check(rc == 2 and "file now cannot be read" in j["verdicts"][-1].get("detail", ""),
          f"removed version-1 file: exit {rc}, {j['verdicts'][-1].get('detail')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--skip-service", action="store_true")
    ap.add_argument("--trajectories", type=int, default=0,
                    help="make the service run at least this many trajectories (e.g. 1000)")
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bitroll_audit_") as tmp:
        c = Ctx(a, tmp)
        test_generate_and_tampering(c)
        test_isa(c)
        if not a.skip_service:
            test_weights_versions(c)
            test_service(c, a.trajectories)
    return oc.report("audit_test", FAILURES, t0)


if __name__ == "__main__":
    sys.exit(main())
