"""Requests at (and one past) every documented limit of `bitroll serve` (docs/protocol.md "Errors"
and "Configuration": max_prompts 4096, max_n 4096, max_samples 262144, max_tokens 1048576,
max_turns 64, max_prompt_tokens 1048576, max_message_bytes 64 MiB), sent by a hostile client while
an innocent client runs a small group (issue 12).

Each hostile request must be either served (it is then aborted once the innocent group is done,
and the Abort must end in GroupDone) or answered with a typed Error; one past a limit must be a
typed Error (InvalidArgument / OutOfRange / ResourceExhausted). Every time, the innocent group
must complete within --innocent-s, bit-equal to `bitroll generate`, and nothing may hang. The
named case: a prompt of 1,048,576 ids with n = 16 (inside every limit, far beyond the model's
context) next to an innocent group: the innocent group completes and the big one gets an Error at
submit (or completes). At the end a drained UpdateWeights must complete and the service must still
serve.

    /usr/bin/python3 tests/outside/hostile_limits_test.py --bitroll build/rollout/bitroll \
        [--mode wal|nowal] [--only NAME]
Exit 0 = pass, 1 = a check failed.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

np = oc.np
zmq = oc.zmq

LIM = {"max_prompts": 4096, "max_n": 4096, "max_samples": 262144, "max_tokens": 1048576,
       "max_turns": 64, "max_prompt_tokens": 1048576, "max_message_bytes": 64 << 20}
P1 = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
TYPED_PAST = ("InvalidArgument", "OutOfRange", "ResourceExhausted")


def cases():
    """(name, kind, submit kwargs or raw bytes builder, expectation)
    expectation: "typed" = must be an Error with one of TYPED_PAST; "either" = Error or served;
    "error_or_done" = Error at submit, or completes by itself."""
    tiny = [1, 5, 6]
    r = np.random.default_rng(12)
    return [
        ("max_n", dict(prompts=[tiny], n=LIM["max_n"], max_tokens=1), "either"),
        ("max_n+1", dict(prompts=[tiny], n=LIM["max_n"] + 1, max_tokens=1), "typed"),
        ("max_prompts", dict(prompts=[tiny] * LIM["max_prompts"], n=1, max_tokens=1), "either"),
        ("max_prompts+1", dict(prompts=[tiny] * (LIM["max_prompts"] + 1), n=1, max_tokens=1),
         "typed"),
        ("max_samples", dict(prompts=[tiny] * 64, n=4096, max_tokens=1), "either"),
        ("max_samples+1", dict(prompts=[tiny] * 65, n=4033, max_tokens=1), "typed"),
        ("max_tokens", dict(prompts=[tiny], n=1, max_tokens=LIM["max_tokens"]), "either"),
        ("max_tokens+1", dict(prompts=[tiny], n=1, max_tokens=LIM["max_tokens"] + 1), "typed"),
        ("max_tokens=0", dict(prompts=[tiny], n=1, max_tokens=0), "typed"),
        ("max_turns", dict(prompts=[tiny], n=1, max_tokens=8, max_turns=LIM["max_turns"]),
         "either"),
        ("max_turns+1", dict(prompts=[tiny], n=1, max_tokens=8,
                             max_turns=LIM["max_turns"] + 1), "typed"),
        ("max_prompt_tokens n=16",
         dict(prompts=[r.integers(3, 512, LIM["max_prompt_tokens"], dtype=np.int32)], n=16,
              max_tokens=8), "error_or_done"),
        ("max_prompt_tokens+1",
         dict(prompts=[r.integers(3, 512, LIM["max_prompt_tokens"] + 1, dtype=np.int32)], n=1,
              max_tokens=8), "typed"),
        ("token id = vocab", dict(prompts=[[1, 512]], n=1, max_tokens=8), "typed"),
        ("near max_message_bytes",  # 4096 prompts x 4000 ids: ~62.5 MiB, inside every limit,
         # each prompt beyond the model's 512-token context: cannot be served
         dict(prompts=[np.full(4000, 7, np.int32)] * 4096, n=1, max_tokens=1), "error_or_done"),
        ("max_message_bytes+1", "raw", "typed"),
    ]


class Hostile:
    def __init__(self, a, tmp):
        self.a, self.tmp = a, tmp
        self.ctx = zmq.Context()
        self.failures = []
        self.outcomes = []
        self.refs = oc.References(a.bitroll, a.model, tmp)
        self.gid = 1000

    def fail(self, msg):
        self.failures.append(msg)
        print("FAIL " + msg, flush=True)

    def submit_raw_prompts(self, w, gid, kw):
        """Like Client.submit, but prompts may be numpy arrays (packed as one vector each)."""
        m = oc.proto.SubmitRolloutsT()
        m.groupId = gid
        m.prompts = []
        for p in kw["prompts"]:
            pt = oc.proto.PromptT()
            pt.ids = np.asarray(p, np.int32)
            m.prompts.append(pt)
        m.n = kw["n"]
        sp = oc.proto.SamplingParamsT()
        sp.temperature, sp.topK, sp.topP, sp.minP = 1.0, 0, 1.0, 0.0
        m.sampling = sp
        m.seed = 1
        m.maxTokens = kw["max_tokens"]
        m.maxTurns = kw.get("max_turns", 1)
        m.stopAtEos = True
        t0 = time.time()
        w.c._send(oc.M.SubmitRollouts, m)
        return time.time() - t0

    def wait_events(self, wires, until, timeout):
        """Pumps wires until until(events) or timeout; returns (events per wire, timed out)."""
        t0 = time.time()
        evs = {id(w): [] for w in wires}
        while time.time() - t0 < timeout:
            for w in wires:
                evs[id(w)] += w.recv_all(20)
            if until(evs):
                return evs, False
        return evs, True

    def innocent_spec(self, k):
        return {"prompts": [[1, 50 + k, 60 + k]], "n": 4, "seed": 100 + k, "params": P1,
                "max_tokens": 16}

    def run_case(self, srv, name, kw, expect, k):
        a = self.a
        evil = oc.Wire(srv.endpoint, f"evil-{k}", self.ctx, light=True)
        good = oc.Wire(srv.endpoint, f"good-{k}", self.ctx)
        gid = self.gid = self.gid + 1
        t0 = time.time()
        if kw == "raw":
            evil.c.send_raw(b"BRL1" * ((LIM["max_message_bytes"] // 4) + 1))
            gid = 0
        else:
            self.submit_raw_prompts(evil, gid, kw)
        ispec = self.innocent_spec(k)
        good.submit(7, ispec)
        # The innocent group must complete (a Busy is retried, as docs/protocol.md asks);
        # collect the hostile reply meanwhile.
        def innocent_done(evs):
            return any(e.kind in ("group_done", "error") for e in evs[id(good)])
        t_inn = time.time()
        busy = 0
        hostile_evs = []
        while True:
            left = a.innocent_s - (time.time() - t_inn)
            evs, timed_out = self.wait_events([evil, good], innocent_done, max(left, 0.1))
            hostile_evs += evs[id(evil)]
            g_evs = evs[id(good)]
            if not timed_out and any(e.kind == "error" and e.data[0] == "Busy" for e in g_evs):
                busy += 1
                time.sleep(0.5)
                good.submit(7, ispec)
                continue
            break
        evs[id(evil)] = hostile_evs
        if busy:
            print(f"  {name}: the innocent client got Busy {busy} times and retried")
        trajs = [e.data for e in g_evs if e.kind == "trajectory"]
        if timed_out:
            self.fail(f"{name}: the innocent group got {len(trajs)} of 4 trajectories and no "
                      f"GroupDone within {a.innocent_s:.0f} s (stalled behind the hostile "
                      "request)")
        elif any(e.kind == "error" for e in g_evs):
            self.fail(f"{name}: the innocent group got an Error: "
                      f"{[e.data for e in g_evs if e.kind == 'error']}")
        else:
            if len(trajs) != 4:
                self.fail(f"{name}: the innocent group got {len(trajs)} trajectories, want 4")
            for t in trajs:
                why = self.refs.check(ispec, t)
                if why:
                    self.fail(f"{name}: innocent trajectory {t.sample_index}: {why}")
        # The hostile request's fate.
        def hostile_answered(e):
            return [x for x in e[id(evil)] if x.kind in ("error", "group_done")]
        if not hostile_answered(evs):
            more, _ = self.wait_events([evil], lambda e: bool(hostile_answered(e)), 3.0)
            evs[id(evil)] += more[id(evil)]
        h = evs[id(evil)]
        errs = [e.data for e in h if e.kind == "error"]
        done = [e for e in h if e.kind == "group_done"]
        ntraj = sum(1 for e in h if e.kind == "trajectory")
        secs = time.time() - t0
        if errs:
            outcome = f"Error {errs[0][0]}: {errs[0][1][:90]}"
            if expect == "typed" and errs[0][0] not in TYPED_PAST:
                self.fail(f"{name}: Error {errs[0][0]}, want one of {TYPED_PAST}")
        elif done:
            outcome = f"served: {ntraj} trajectories, GroupDone {done[0].data}"
            if expect == "error_or_done":
                print(f"  NOTE {name}: cannot be served, yet accepted (no Error at submit); it "
                      f"completed by itself: {done[0].data}")
            if expect == "typed":
                self.fail(f"{name}: past a limit, yet served ({ntraj} trajectories)")
        else:
            if expect == "typed":
                self.fail(f"{name}: past a documented limit, no typed Error within "
                          f"{secs:.0f} s (got {ntraj} trajectories; the connection may have "
                          "been dropped silently)")
                outcome = "no reply"
            else:
                # Accepted and still running: abort it; the Abort must end in GroupDone.
                evil.abort(gid)
                more, to = self.wait_events(
                    [evil], lambda e: any(x.kind in ("group_done", "error") for x in e[id(evil)]),
                    a.abort_s)
                m = more[id(evil)]
                d = [x for x in m if x.kind == "group_done"]
                er = [x.data for x in m if x.kind == "error"]
                ntraj += sum(1 for x in m if x.kind == "trajectory")
                if d:
                    outcome = (f"accepted, aborted after {ntraj} trajectories: GroupDone "
                               f"{d[0].data}")
                elif er:
                    outcome = f"accepted, then Error {er[0][0]}: {er[0][1][:90]}"
                else:
                    outcome = "accepted, Abort got no GroupDone"
                    self.fail(f"{name}: accepted, then Abort got no GroupDone within "
                              f"{a.abort_s:.0f} s ({ntraj} trajectories so far)")
                if expect == "error_or_done":
                    self.fail(f"{name}: cannot be served (prompt far beyond the model's "
                              f"context) but got no Error at submit; {outcome}")
        rss = srv.rss_kb()
        line = f"{name:26s} -> {outcome} ({secs:.1f} s, RSS {oc.fmt_kb(rss)})"
        self.outcomes.append(line)
        print("  " + line, flush=True)
        evil.close()
        good.close()
        if not srv.alive():
            self.fail(f"{name}: bitroll serve died:\n{srv.log_tail()}")
            return False
        return True

    def after(self, srv, name, k):
        """A drained UpdateWeights must complete after the hostile request, then a group."""
        a = self.a
        w = oc.Wire(srv.endpoint, f"final-{k}", self.ctx)
        try:
            rid = w.send_status()
            evs, to = self.wait_events([w], lambda e: any(x.rid == rid for x in e[id(w)]), 10)
            st = [x.data for x in evs[id(w)] if x.kind == "status"]
            if not st:
                return self.fail(f"{name}: no StatusReply within 10 s afterwards")
            v = st[0]["weight_version"] + 1
            t0 = time.time()
            rid = w.send_update(a.model, v, True)
            evs, to = self.wait_events(
                [w], lambda e: any(x.rid == rid and x.kind in ("ack", "error")
                                   for x in e[id(w)]), a.abort_s)
            r = [x for x in evs[id(w)] if x.rid == rid and x.kind in ("ack", "error")]
            if to or not r:
                return self.fail(f"{name}: a later drained UpdateWeights v{v} got no reply "
                                 f"within {a.abort_s:.0f} s (work that never drains)")
            if r[0].kind == "error":
                return self.fail(f"{name}: a later drained UpdateWeights v{v}: Error {r[0].data}")
            ispec = self.innocent_spec(50 + k)
            w.submit(5, ispec)
            evs, to = self.wait_events(
                [w], lambda e: any(x.kind in ("group_done", "error") for x in e[id(w)]),
                a.innocent_s)
            bad = [x.data for x in evs[id(w)] if x.kind == "error"]
            if to or bad:
                return self.fail(f"{name}: a group after the drained update did not complete"
                                 f" ({'timeout' if to else bad[0]})")
            return f"drained update {time.time() - t0:.1f} s"
        finally:
            w.close()

    def run(self):
        a = self.a
        mnt = None
        if a.mode == "wal":
            # The WAL logs the request bytes with every sample's header: keep what a hostile
            # request makes it write on a bounded tmpfs, never on the shared disk.
            mnt = os.path.join(self.tmp, "tmpfs")
            os.makedirs(mnt)
            r = oc.subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.wal_mib}m", "tmpfs",
                                   mnt], capture_output=True)
            if r.returncode != 0:
                print(f"NOTE: cannot mount a tmpfs ({r.stderr.decode().strip()}); the cases "
                      "that can make the WAL huge are skipped")
                mnt, self.no_tmpfs = None, True
        try:
            for k, (name, kw, expect) in enumerate(cases()):
                if a.only and a.only != name:
                    continue
                if a.mode == "wal" and mnt is None and name in ("max_samples",
                                                                "near max_message_bytes"):
                    continue
                data = None
                if a.mode == "wal":
                    data = os.path.join(mnt or self.tmp, f"data{k}")
                srv = oc.Server(a.bitroll, a.model, data_dir=data,
                                log=os.path.join(self.tmp, f"serve{k}.log"))
                srv.start()
                try:
                    ok = self.run_case(srv, name, kw, expect, k)
                    if ok:
                        r = self.after(srv, name, k) or "after: FAILED"
                        if data:
                            du = oc.subprocess.run(["du", "-sm", data], capture_output=True)
                            r = f"{r}; WAL {du.stdout.decode().split()[0]} MiB"
                        self.outcomes[-1] += f" [{r}]"
                        if not srv.alive():
                            self.fail(f"{name}: bitroll serve died:\n{srv.log_tail()}")
                finally:
                    tail = srv.log_tail(800)
                    srv.kill9()
                    if data:
                        oc.shutil.rmtree(data, ignore_errors=True)
                    if self.failures and self.failures[-1].startswith(name):
                        print(f"  service log tail ({name}):\n" + tail)
        finally:
            if mnt:
                oc.subprocess.run(["umount", mnt])
            self.ctx.destroy(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--mode", default="wal", choices=["wal", "nowal"])
    ap.add_argument("--only", help="run one case by name")
    ap.add_argument("--innocent-s", type=float, default=20.0)
    ap.add_argument("--abort-s", type=float, default=30.0)
    ap.add_argument("--wal-mib", type=int, default=1024, help="tmpfs size for the WAL")
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    with oc.TempDir("bitroll_hostile_") as tmp:
        h = Hostile(a, tmp)
        h.run()
    for line in h.outcomes:
        print("  " + line)
    return oc.report(f"hostile_limits_test ({a.mode})", h.failures, t0)


if __name__ == "__main__":
    sys.exit(main())
