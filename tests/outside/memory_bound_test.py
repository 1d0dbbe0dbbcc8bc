"""Memory bound of `bitroll serve` under clients that vanish or never read (issue 12).

For each mode (with --data-dir, and without):
  1. warm-up: a normal client runs one group; baseline VmRSS / RssAnon and Status.groups;
  2. a hog client (socket receive buffer and queue shrunk to almost nothing) submits --hog-groups
     groups with streamed tokens and never reads;
  3. --clients clients each submit a small group and vanish (close the socket without reading);
  4. a normal client submits a group: every trajectory must arrive within --serve-s seconds,
     bit-equal to `bitroll generate`;
  5. once the service is idle (Status: nothing queued or in flight), Status.groups must be back to
     what the live clients hold (finished groups of vanished clients leave memory; with a WAL they
     stay only in the WAL) and the RSS growth over the baseline must stay under --growth-mib;
  6. with --data-dir: one vanished client comes back with its client_id and re-attaches its
     group: it gets all its trajectories and GroupDone (re-attach reloads a finished group).

The bounds come from the design: the hog may hold at most --max-client-buffer-bytes (1 MiB here)
of unread replies plus ZeroMQ's per-peer queue before it is dropped, and finished groups of
vanished clients leave memory, so the growth is the KV cache the work touches (--kv-mib, 32 MiB
via --config) + that buffer + LMDB's mapped pages and allocator slack: --growth-mib 64; and
nothing may grow with the number of vanished clients: a second wave of --clients may add at most
--leak-mib (8 MiB, 8 KiB per client). Measured (stories260K, 1 replica, 2-core machine): the
issue-12 code grows +45..49 MiB with a WAL (RssAnon +28..31, LMDB RssFile +17..19) and +26..28 MiB
without, and +0.3..2.1 MiB over the second wave; the code before it stalled (no StatusReply for
30 s) with +57 / +46 MiB. The test prints the numbers either way.

    /usr/bin/python3 tests/outside/memory_bound_test.py --bitroll build/rollout/bitroll \
        [--clients 1000] [--mode wal|nowal|both]
Exit 0 = pass, 1 = a check failed.
"""

import argparse
import os
import secrets
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

zmq = oc.zmq


def rss(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


class Run:
    def __init__(self, a, mode, tmp):
        self.a, self.mode, self.tmp = a, mode, tmp
        self.failures = []
        self.ctx = zmq.Context()
        self.refs = oc.References(a.bitroll, a.model, tmp)

    def fail(self, msg):
        line = f"[{self.mode}] {msg}"
        self.failures.append(line)
        print("FAIL " + line, flush=True)

    def status(self, w, timeout=10.0):
        return oc.wait_status(w, timeout, poll_ms=50)

    def run_group(self, w, gid, spec, timeout):
        """Submits and reads one group: (trajectories, GroupDone or None, errors, seconds)."""
        t0 = time.time()
        w.submit(gid, spec)
        trajs, done, errors = [], None, []
        while time.time() - t0 < timeout and done is None and not errors:
            for ev in w.recv_all(50):
                if ev.gid != gid:
                    continue
                if ev.kind == "trajectory":
                    trajs.append(ev.data)
                elif ev.kind == "group_done":
                    done = ev.data
                elif ev.kind == "error":
                    errors.append(ev.data)
        return trajs, done, errors, time.time() - t0

    def vanish(self, srv, small, first):
        ids = []
        t0 = time.time()
        for i in range(first, first + self.a.clients):
            cid = f"vanish-{i}-" + secrets.token_hex(4)
            ids.append(cid)
            c = oc.bitroll.Client(srv.endpoint, context=self.ctx, client_id=cid)
            c._sock.setsockopt(zmq.LINGER, 2000)   # the submit must leave before the close
            c.submit(small["prompts"], n=small["n"], params=small["params"], seed=small["seed"],
                     max_tokens=small["max_tokens"], group_id=100000 + i)
            c.close()
        print(f"  [{self.mode}] {self.a.clients} clients submitted a group and vanished "
              f"({time.time() - t0:.1f} s)")
        return ids

    def wait_idle(self, w):
        t0 = time.time()
        st = None
        while time.time() - t0 < self.a.idle_s:
            st = self.status(w)
            if st is not None and st["queued"] == 0 and st["inflight"] == 0:
                break
            time.sleep(0.5)
        if st is None:
            self.fail(f"no StatusReply for {self.a.idle_s:.0f} s: the service is stalled")
        elif st["queued"] or st["inflight"]:
            self.fail(f"service not idle after {self.a.idle_s:.0f} s: queued {st['queued']} in "
                      f"flight {st['inflight']}")
        time.sleep(1.0)
        return st

    def check_group(self, what, spec, res):
        trajs, done, errors, secs = res
        want = len(spec["prompts"]) * spec["n"]
        if errors:
            return self.fail(f"{what}: Error {errors[0]}")
        if done is None:
            return self.fail(f"{what}: got {len(trajs)} of {want} trajectories and no GroupDone "
                             f"within {secs:.0f} s")
        got = sorted((t.prompt_index, t.sample_index) for t in trajs)
        if len(got) != want or len(set(got)) != want:
            return self.fail(f"{what}: {len(got)} trajectories ({len(set(got))} distinct), "
                             f"want {want}")
        for t in trajs:
            why = self.refs.check(spec, t)
            if why:
                return self.fail(f"{what}: trajectory {t.prompt_index}/{t.sample_index}: {why}")
        print(f"  [{self.mode}] {what}: {want} trajectories in {secs:.2f} s, bits = generate")

    def run(self):
        a = self.a
        cfg = os.path.join(self.tmp, "serve.json")
        with open(cfg, "w") as f:   # a small KV cache: its pages are part of the RSS
            f.write('{"kv_cache_bytes": %d}' % (a.kv_mib << 20))
        extra = ["--config", cfg]
        if a.buffer_flag:
            extra += ["--max-client-buffer-bytes", str(a.max_client_buffer_bytes)]
        data = os.path.join(self.tmp, "data") if self.mode == "wal" else None
        srv = oc.Server(a.bitroll, a.model, data_dir=data, extra=extra,
                        log=os.path.join(self.tmp, f"serve_{self.mode}.log"))
        srv.start()
        try:
            return self._run(srv)
        finally:
            tail = srv.log_tail(1500)
            srv.kill9()
            if self.failures:
                print(f"  [{self.mode}] service log tail:\n{tail}")
            self.ctx.destroy(0)

    def _run(self, srv):
        a = self.a
        spec = {"prompts": [[1, 400, 300, 200]], "n": 4, "seed": 11,
                "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, "max_tokens": 24}
        small = {"prompts": [[1] + [(i * 37) % 500 + 3 for i in range(40)]], "n": 1, "seed": 5,
                 "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, "max_tokens": 8}
        normal = oc.Wire(srv.endpoint, "normal-" + secrets.token_hex(4), self.ctx)
        self.check_group("warm-up group", spec, self.run_group(normal, 900001, spec, 60))
        st0 = self.status(normal)
        time.sleep(0.5)
        base = rss(srv.proc.pid)
        print(f"  [{self.mode}] baseline VmRSS {oc.fmt_kb(base.get('VmRSS'))} RssAnon "
              f"{oc.fmt_kb(base.get('RssAnon'))}, Status.groups {st0 and st0['groups']}")

        # The hog: never reads, with almost no room on its side of the connection.
        hog_sock = self.ctx.socket(zmq.DEALER)
        hog_sock.setsockopt(zmq.RCVHWM, 1)
        hog_sock.setsockopt(zmq.RCVBUF, 4096)
        hog_sock.setsockopt(zmq.LINGER, 0)
        hog_sock.connect(srv.endpoint)
        hog = oc.bitroll.Client(srv.endpoint, context=self.ctx)
        hog._sock.close(0)
        hog._sock = hog_sock          # the Client's builders, this socket
        hog_spec = {"prompts": [[1, 9, 8, 7]], "n": 8, "seed": 3,
                    "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, "max_tokens": 64}
        for gid in range(1, a.hog_groups + 1):
            hog.submit(hog_spec["prompts"], n=hog_spec["n"], params=hog_spec["params"],
                       seed=hog_spec["seed"], max_tokens=hog_spec["max_tokens"], group_id=gid,
                       stream_tokens=True)
        print(f"  [{self.mode}] hog submitted {a.hog_groups} groups x 8 samples, streaming, "
              "never reads")

        # The vanishing clients (group ids distinct from everyone else's).
        ids = self.vanish(srv, small, 0)
        mid = rss(srv.proc.pid)

        # A normal client must still be served promptly.
        self.check_group("normal client during the load", spec,
                         self.run_group(normal, 900002, spec, a.serve_s))
        st = self.wait_idle(normal)
        end = rss(srv.proc.pid)
        grow = {k: end.get(k, 0) - base.get(k, 0) for k in ("VmRSS", "RssAnon", "RssFile")}
        print(f"  [{self.mode}] after load: VmRSS {oc.fmt_kb(end.get('VmRSS'))} (+"
              f"{oc.fmt_kb(grow['VmRSS'])}; RssAnon +{oc.fmt_kb(grow['RssAnon'])}, RssFile +"
              f"{oc.fmt_kb(grow['RssFile'])}); peak during submit VmRSS "
              f"{oc.fmt_kb(mid.get('VmRSS'))}; Status.groups {st and st['groups']}")
        if grow["VmRSS"] > a.growth_mib * 1024:
            self.fail(f"VmRSS grew by {oc.fmt_kb(grow['VmRSS'])} (bound {a.growth_mib} MiB) "
                      f"after {a.clients} vanished clients and a hog that never reads")
        # Live groups: the hog's (if still attached) at most; none of the vanished clients'.
        if st is not None and st["groups"] > a.hog_groups:
            self.fail(f"Status.groups = {st['groups']} once idle: finished groups of "
                      f"{a.clients} vanished clients still held as live groups (want <= "
                      f"{a.hog_groups}, the hog's)")

        # A second wave of vanishing clients: once warm, nothing may grow with their number.
        ids += self.vanish(srv, small, a.clients)
        self.wait_idle(normal)
        end2 = rss(srv.proc.pid)
        st2 = self.status(normal)
        leak = end2.get("VmRSS", 0) - end.get("VmRSS", 0)
        print(f"  [{self.mode}] after a second wave of {a.clients}: VmRSS "
              f"{oc.fmt_kb(end2.get('VmRSS'))} ({'+' if leak >= 0 else ''}{oc.fmt_kb(leak)}, "
              f"{leak * 1024 / a.clients:.0f} bytes per vanished client); Status.groups "
              f"{st2 and st2['groups']}")
        if leak > a.leak_mib * 1024:
            self.fail(f"VmRSS grew by {oc.fmt_kb(leak)} over a second wave of {a.clients} "
                      f"vanished clients (bound {a.leak_mib} MiB): per-group state is kept")
        if st2 is not None and st2["groups"] > a.hog_groups:
            self.fail(f"Status.groups = {st2['groups']} after the second wave (want <= "
                      f"{a.hog_groups})")
        dropped = "dropping a client that does not read" in open(srv.log, errors="replace").read()
        print(f"  [{self.mode}] service log {'mentions' if dropped else 'does NOT mention'} "
              "dropping the client that does not read")
        if not dropped:
            self.fail("the service dropped (or stalled on) the client that never reads without "
                      "logging why")
        hog_sock.close(0)
        # Re-attach: a vanished client comes back (WAL mode only).
        if self.mode == "wal":
            i = len(ids) // 2
            back = oc.Wire(srv.endpoint, ids[i], self.ctx)
            self.check_group("re-attach of a vanished client's finished group", small,
                             self.run_group(back, 100000 + i, small, 30))
            back.close()
        # The service still serves.
        self.check_group("normal client at the end", spec,
                         self.run_group(normal, 900003, spec, 30))
        normal.close()
        if not srv.alive():
            self.fail("bitroll serve died")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--mode", default="both", choices=["wal", "nowal", "both"])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--hog-groups", type=int, default=200)
    ap.add_argument("--max-client-buffer-bytes", type=int, default=1 << 20,
                    help="passed to serve when it knows the flag")
    ap.add_argument("--kv-mib", type=int, default=32, help="the service's KV cache (config)")
    ap.add_argument("--growth-mib", type=int, default=64,
                    help="bound on VmRSS growth: KV cache + client buffer + slack")
    ap.add_argument("--leak-mib", type=int, default=8,
                    help="bound on VmRSS growth over the second wave of vanishing clients")
    ap.add_argument("--serve-s", type=float, default=30.0,
                    help="the normal client's group must complete within this")
    ap.add_argument("--idle-s", type=float, default=30.0)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    a.buffer_flag = oc.supports_flag(a.bitroll, a.model, "--max-client-buffer-bytes", "1048576")
    if not a.buffer_flag:
        print("NOTE: this bitroll serve has no --max-client-buffer-bytes; running with defaults")
    failures = []
    t0 = time.time()
    for mode in (["wal", "nowal"] if a.mode == "both" else [a.mode]):
        with oc.TempDir(f"bitroll_mem_{mode}_") as tmp:
            r = Run(a, mode, tmp)
            r.run()
            failures += r.failures
    return oc.report("memory_bound_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
