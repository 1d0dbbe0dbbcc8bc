"""Model-based protocol test of `bitroll serve --data-dir`, driven from outside (issue 12).

A seeded random program of 4 clients (raw DEALER sockets; client ids: 0, 1 and 3 distinct, 2
shares 0's id with disjoint group ids; group ids 21..60 collide across owners on purpose) submits
groups, re-attaches them (re-sends the same SubmitRollouts with the same client_id on a new
connection), acknowledges early / late / twice / out of range / another owner's group, aborts its
own and other owners' groups, asks Status, updates weights (same model file, version v+1, drain
true and false: bits stay those of `bitroll generate`), closes its socket and reconnects, stops
reading for a while, and the program kill -9s the service at random points and restarts it on the
same port and data dir (every client then re-attaches its unfinished groups).

A reference model says what each connection must receive (docs/protocol.md, issue 12):
  * an attachment (one SubmitRollouts of (owner, group) on one connection) that ends in GroupDone
    got every trajectory of the group exactly once, except those acknowledged (durably: at a
    kill, an ack that a StatusReply showed handled at an LSN the WAL had committed before the kill
    (StatusReply.wal_committed_lsn), or older than SETTLE s; any ack while the service lived; a
    fresher ack at a kill may or may not be lost, so that trajectory may come once);
  * never a duplicate inside one attachment, never an acknowledged trajectory again, never a
    trajectory or GroupDone of a group this connection did not attach (client_tag =
    "client_id/group" tells owners apart), never anything after GroupDone;
  * an early, repeated or out-of-range Ack never disturbs delivery; another owner's Abort gets
    Error NotFound and leaves the group alone; an Abort of one's own live group ends in GroupDone;
  * every trajectory's ids and fp32 logprob bits equal `bitroll generate --json` (same prompt,
    params, seed, sample index);
  * every group that was not aborted completes (nothing frozen) once clients re-attach at the end;
  * the service's VmRSS stays under --rss-mib.

Left out as unspecified: re-sending a group whose every trajectory is (maybe) acknowledged (the
WAL may have compacted it; such groups are retired), re-sending a finished group on the same live
connection (--resubmit-done-weight). An Ack whose index lists differ in length must be refused
with Error{InvalidArgument} and acknowledge nothing.

    /usr/bin/python3 tests/outside/protocol_model_test.py --bitroll build/rollout/bitroll \
        [--seed S] [--steps N] [--keep-going] [--ops-off kill,update,...]

The op and its client at each step depend only on (seed, step); targets (which group, which
samples) on the state, so arrival timing can still vary them. On failure it prints the seed, the
step, the failing group's own history (submits, acks and how they resolved, kills) and the last
ops; --ops-off narrows a failure down. Exit 0 = pass, 1 = a check failed.
"""

import argparse
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

SETTLE = 5.0         # s: an ack processed this long before a kill is durable, committed or not
                     # (the WAL commits every 10 ms: one this late means it is never committed)
WAIT_S = 30.0        # every wait for the service is bounded by this
VOCAB = 512          # stories260K


class Failure(Exception):
    pass


class GroupState:
    def __init__(self, owner, gid, spec):
        self.owner, self.gid, self.spec = owner, gid, spec
        self.all = {(p, s) for p in range(len(spec["prompts"])) for s in range(spec["n"])}
        self.ack = {}             # pair -> ("def",) | ("applied", t, lsn) | ("maybe",)
        self.state = "live"       # live | done | aborting | retired
        self.received_ever = set()
        self.attaches = 0
        self.hist = []            # this group's own trace, printed with its failures

    def acked_now(self, pair):
        a = self.ack.get(pair)
        return a is not None and a[0] in ("def", "applied")


class Attachment:
    def __init__(self, g, wire_no, step):
        self.g, self.wire_no, self.step = g, wire_no, step
        self.expect = {p for p in g.all if p not in g.ack}                 # exactly once
        self.maybe = {p for p in g.all if g.ack.get(p, ("",))[0] == "maybe"}  # at most once
        self.forbid = {p for p in g.all if g.acked_now(p)}                  # never
        self.got = {}
        self.done = False
        self.aborting = False
        self.other_abort_seen = False


class Slot:
    def __init__(self, idx, client_id, gids):
        self.idx, self.client_id, self.gids = idx, client_id, gids
        self.wire = None
        self.wire_no = 0
        self.att = {}             # gid -> Attachment on the current wire
        self.pending_acks = []    # (rid_before, GroupState|None, pairs, early) on this wire
        self.pending_status = {}  # rid -> step
        self.expect_notfound = {}  # gid -> step (Abort of a group this owner does not have)
        self.expect_badack = {}  # gid -> malformed Acks sent, each owed an InvalidArgument
        self.paused_until = -1


class Model:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.step = 0
        self.trace = []
        self.failures = []
        self.counts = {}
        self.ctx = oc.zmq.Context()
        self.max_rss = 0
        self.kills = 0
        self.version = None
        self.update_rid = None
        ids = [f"owner{a.seed}-{i}" for i in range(4)]
        ids[2] = ids[0]                       # slot 2 shares slot 0's client_id
        # Group ids collide across owners (21..40 for slots 0/1, 41..60 for 1/3); slot 2 is owner
        # 0's second connection with its own ids.
        self.slots = [Slot(0, ids[0], list(range(1, 41))), Slot(1, ids[1], list(range(21, 61))),
                      Slot(2, ids[2], list(range(101, 141))),
                      Slot(3, ids[3], list(range(41, 81)))]
        self.groups = {}          # (client_id, gid) -> GroupState
        r = random.Random(a.seed * 7919 + 1)
        self.recipes = []
        for _ in range(8):
            prompts = [[1] + [r.randrange(3, VOCAB) for _ in range(r.randrange(1, 6))]
                       for _ in range(r.randrange(1, 3))]
            temp = r.choice([0.0, 0.8, 1.0])
            params = {"temperature": temp, "top_k": r.choice([0, 20]),
                      "top_p": r.choice([1.0, 0.9]), "min_p": 0.0}
            self.recipes.append({"prompts": prompts, "n": r.randrange(1, 5),
                                 "seed": r.randrange(1, 1 << 31), "params": params,
                                 "max_tokens": r.randrange(8, 25)})

    # ---- bookkeeping ----

    def note(self, msg):
        self.trace.append(f"[{self.step}] {msg}")
        if len(self.trace) > 400:
            del self.trace[:100]

    def gnote(self, g, msg):
        g.hist.append(f"[{self.step}] {msg}")
        self.note(f"g{g.gid}/{g.owner}: {msg}")

    def fail(self, msg, g=None):
        line = f"step {self.step}: {msg}"
        if g is not None:
            line += "\n      history of this group:\n" + "\n".join(
                "        " + h for h in g.hist[-30:])
        self.failures.append(line)
        self.note("FAIL " + msg)
        print(f"FAIL seed={self.a.seed} {line}", flush=True)
        if not self.a.keep_going:
            raise Failure(line)

    def failg(self, at, msg):
        return self.fail(msg, g=None if at is None else at.g)

    def count(self, op):
        self.counts[op] = self.counts.get(op, 0) + 1

    def sample_rss(self):
        kb = self.server.rss_kb()
        if kb:
            self.max_rss = max(self.max_rss, kb)
            if kb > self.a.rss_mib * 1024:
                self.fail(f"service RSS {oc.fmt_kb(kb)} above the bound {self.a.rss_mib} MiB")

    # ---- connections ----

    def connect(self, s):
        s.wire = oc.Wire(self.server.endpoint, s.client_id, self.ctx)
        s.wire_no += 1
        s.att, s.pending_acks, s.pending_status, s.expect_notfound = {}, [], {}, {}
        s.expect_badack = {}
        self.note(f"slot{s.idx} connect wire#{s.wire_no}")

    def disconnect(self, s, why):
        if s.wire is None:
            return
        self.pump(s)
        for (_, g, pairs, early) in s.pending_acks:
            if g is None:
                continue
            for p in pairs:
                if p in g.all and not g.acked_now(p) and (p in g.received_ever or early):
                    g.ack[p] = ("maybe",)
        s.wire.close()
        s.wire = None
        for gid, at in s.att.items():
            if at.aborting and not at.done:
                at.g.state = "retired"     # its Abort may or may not have been applied
        s.att = {}
        s.pending_acks, s.pending_status, s.expect_notfound = [], {}, {}
        s.expect_badack = {}
        self.note(f"slot{s.idx} disconnect ({why})")

    def attach(self, s, g):
        g.attaches += 1
        at = Attachment(g, s.wire_no, self.step)
        at.no = g.attaches
        s.att[g.gid] = at
        s.wire.submit(g.gid, g.spec, client_tag=f"{s.client_id}/{g.gid}")
        self.gnote(g, f"slot{s.idx} wire#{s.wire_no} submit (attach #{g.attaches}, state "
                      f"{g.state}): expect {sorted(at.expect)} maybe {sorted(at.maybe)} forbid "
                      f"{sorted(at.forbid)}")

    # ---- receiving ----

    def pump(self, s, timeout_ms=0):
        if s.wire is None:
            return
        for ev in s.wire.recv_all(timeout_ms):
            self.on_event(s, ev)

    def pump_all(self, timeout_ms=0):
        for s in self.slots:
            if s.wire is not None and s.paused_until <= self.step:
                self.pump(s, timeout_ms)

    def on_event(self, s, ev):
        who = f"slot{s.idx}(client {s.client_id}, wire#{s.wire_no})"
        if ev.kind == "trajectory":
            t = ev.data
            at = s.att.get(ev.gid)
            if at is not None:
                who += f" attach #{at.no} (step {at.step})"
            if at is None:
                return self.failg(at, f"{who} got a Trajectory of group {ev.gid} (tag "
                                 f"{t.client_tag!r}) it never attached on this connection")
            g = at.g
            if t.client_tag != f"{s.client_id}/{g.gid}":
                return self.failg(at, f"{who} group {g.gid}: Trajectory with another owner's tag "
                                 f"{t.client_tag!r}: leaked across owners")
            if at.done:
                return self.failg(at, f"{who} group {g.gid}: Trajectory after GroupDone")
            pair = (t.prompt_index, t.sample_index)
            if pair not in g.all:
                return self.failg(at, f"{who} group {g.gid}: Trajectory {pair} outside the group")
            at.got[pair] = at.got.get(pair, 0) + 1
            if at.got[pair] > 1:
                return self.failg(at, f"{who} group {g.gid}: Trajectory {pair} delivered twice in "
                                 f"one attachment (attached at step {at.step})")
            if pair in at.forbid or g.acked_now(pair):
                return self.failg(at, f"{who} group {g.gid}: acknowledged Trajectory {pair} "
                                 f"delivered again (ack {g.ack.get(pair)})")
            if g.ack.get(pair, ("",))[0] == "maybe":
                del g.ack[pair]          # it came: the ack was lost, it is unacknowledged
            g.received_ever.add(pair)
            self.count("trajectory")
            if t.finish == "aborted":
                if not at.aborting:
                    return self.failg(at, f"{who} group {g.gid}: Trajectory {pair} finished "
                                     "'aborted' but this owner never aborted it")
                return
            if t.finish not in ("length", "eos", "stop"):
                return self.failg(at, f"{who} group {g.gid}: Trajectory {pair} finish={t.finish} "
                                 f"error={t.error}")
            why = self.refs.check(g.spec, t)
            if why:
                return self.failg(at, f"{who} group {g.gid}: Trajectory {pair}: {why}")
        elif ev.kind == "group_done":
            at = s.att.get(ev.gid)
            if at is not None:
                who += f" attach #{at.no} (step {at.step})"
            if at is None:
                return self.failg(at, f"{who} got GroupDone of group {ev.gid} it never attached")
            if at.done:
                return self.failg(at, f"{who} group {ev.gid}: a second GroupDone")
            at.done = True
            g = at.g
            self.count("group_done")
            self.gnote(g, f"slot{s.idx} GroupDone {ev.data}, got {sorted(at.got)}")
            if ev.data["aborted"] and not at.aborting:
                return self.failg(at, f"{who} group {g.gid}: GroupDone says aborted="
                                 f"{ev.data['aborted']}, but this owner never aborted it")
            if at.aborting:
                g.state = "retired"
                return
            missing = sorted(at.expect - set(at.got))
            if missing:
                return self.failg(at, f"{who} group {g.gid}: GroupDone but {len(missing)} "
                                 f"trajectories never came: {missing[:6]} (attached at step "
                                 f"{at.step}, expected {len(at.expect)})")
            for p in at.maybe - set(at.got):
                g.ack[p] = ("applied", time.time(), None)  # the service holds it acknowledged
            g.state = "done"
        elif ev.kind == "error":
            code, msg = ev.data
            at = s.att.get(ev.gid)
            if code == "InvalidArgument" and s.expect_badack.get(ev.gid, 0) > 0:
                s.expect_badack[ev.gid] -= 1
                self.count("ack_mismatched_refused")
                return
            if code == "NotFound" and ev.gid in s.expect_notfound:
                del s.expect_notfound[ev.gid]
                self.count("abort_other_notfound")
                return
            if code == "NotFound" and at is not None and at.aborting and at.done:
                return  # Abort raced with the group's normal end
            if self.update_rid is not None and ev.rid == self.update_rid:
                self.update_reply = ev
                return self.fail(f"{who} UpdateWeights answered Error {code}: {msg}")
            return self.fail(f"{who} unexpected Error {code} for group {ev.gid}: {msg}")
        elif ev.kind == "status":
            self.count("status_reply")
            now = time.time()
            keep = []
            for item in s.pending_acks:
                rid_before, g, pairs, early = item
                if rid_before >= ev.rid:
                    keep.append(item)
                    continue
                if g is None:
                    continue
                for p in pairs:
                    if p not in g.all or g.ack.get(p, ("",))[0] == "def":
                        continue
                    if early:
                        if p in g.received_ever:      # it came while the ack travelled
                            if not g.acked_now(p):
                                g.ack[p] = ("maybe",)
                                g.hist.append(f"[{self.step}] early ack {p} -> maybe")
                        else:
                            g.hist.append(f"[{self.step}] early ack {p} -> ignored")
                    elif p in g.received_ever and not g.acked_now(p):
                        g.ack[p] = ("applied", now, ev.data["wal_last_lsn"])
                        g.hist.append(f"[{self.step}] ack {p} -> applied (status reply)")
            s.pending_acks = keep
            s.pending_status.pop(ev.rid, None)
            if self.version is None:
                self.version = ev.data["weight_version"]
        elif ev.kind == "ack":
            if ev.rid != self.update_rid:
                return self.fail(f"{who} unexpected Ack rid {ev.rid}")
            self.update_reply = ev
        elif ev.kind == "chunk":
            return self.fail(f"{who} got a TokenChunk without asking for streaming")
        else:
            return self.fail(f"{who} unexpected message {ev}")

    # ---- ops ----

    def live_atts(self, s):
        return [at for gid, at in sorted(s.att.items()) if not at.done and not at.aborting]

    def op_submit(self, s):
        free = [gid for gid in s.gids if (s.client_id, gid) not in self.groups]
        if not free or len(self.live_atts(s)) >= 3:
            return self.op_pump()
        gid = self.rng.choice(free)
        g = GroupState(s.client_id, gid, self.rng.choice(self.recipes))
        self.groups[(s.client_id, gid)] = g
        self.attach(s, g)

    def op_reattach_done(self, s):
        """Re-sends a finished group's SubmitRollouts on the same, live connection (off by
        default: --resubmit-done-weight; the issue only specifies re-attach after a reconnect or
        a restart)."""
        cands = [g for k, g in sorted(self.groups.items()) if k[0] == s.client_id and
                 g.gid in s.gids and g.state == "done" and
                 any(p not in g.ack for p in g.all)]
        if not cands:
            return self.op_pump()
        g = self.rng.choice(cands)
        self.sync_status(s)              # acks sent before are processed before the re-submit
        g.state = "live"
        self.attach(s, g)

    def send_ack(self, s, gid, pairs, early=False, kind="ack"):
        before = next(s.wire.c._request_ids)     # consume one id: the Ack's id is above it
        g = self.groups.get((s.client_id, gid))
        s.pending_acks.append((before, g, list(pairs), early))
        s.wire.ack(gid, list(pairs))
        if g is not None:
            self.gnote(g, f"slot{s.idx} {kind} {list(pairs)[:8]}")
        else:
            self.note(f"slot{s.idx} {kind} g{gid} {list(pairs)[:6]}")
        self.count(kind)

    def op_ack(self, s, mode):
        if mode == "other":
            gid = self.rng.choice(self.other_gids(s))
            for k, g in self.groups.items():
                if k[1] == gid:
                    self.gnote(g, f"slot{s.idx} ({s.client_id}) sends Ack of this group id "
                                  "[(0, 0), (0, 1)]")
            return self.send_ack(s, gid, [(0, 0), (0, 1)], kind="ack_other")
        atts = [at for gid, at in sorted(s.att.items())]
        if not atts:
            return self.op_pump()
        at = self.rng.choice(atts)
        g = at.g
        if mode == "late":
            got = sorted(at.got)
            if not got:
                return self.op_pump()
            pairs = self.rng.sample(got, self.rng.randrange(1, len(got) + 1))
            return self.send_ack(s, g.gid, pairs, kind="ack_late")
        if mode == "twice":
            acked = sorted(p for p in g.all if g.acked_now(p))
            if not acked:
                return self.op_pump()
            return self.send_ack(s, g.gid, acked, kind="ack_twice")
        if mode == "early":
            # Only in a group's first attachment: there "not received" means "not delivered".
            notyet = sorted(p for p in g.all if p not in g.received_ever and p not in g.ack)
            if not notyet or at.done or g.attaches != 1:
                return self.op_pump()
            return self.send_ack(s, g.gid, [self.rng.choice(notyet)], early=True,
                                 kind="ack_early")
        if mode == "range":
            np_, n = len(g.spec["prompts"]), g.spec["n"]
            pairs = self.rng.choice([[(np_, 0)], [(0, n)], [(np_ + 7, n + 9)],
                                     [(2**32 - 1, 2**32 - 1)], [(0, 0), (np_, n)]])
            pairs = [p for p in pairs if p not in g.all or p in at.got]
            return self.send_ack(s, g.gid, pairs, kind="ack_out_of_range")

    def op_ack_mismatched(self, s):
        """An Ack whose two index lists differ in length ([pi, pi, pi] and [si]): the service
        must refuse it (Error InvalidArgument) and acknowledge nothing."""
        atts = [at for gid, at in sorted(s.att.items()) if at.got]
        if not atts:
            return self.op_pump()
        at = self.rng.choice(atts)
        pi, si = self.rng.choice(sorted(at.got))
        a = oc.proto.AckT()
        a.groupId, a.promptIndex, a.sampleIndex = at.g.gid, [pi, pi, pi], [si]
        s.expect_badack[at.g.gid] = s.expect_badack.get(at.g.gid, 0) + 1
        s.wire.c._send(oc.M.Ack, a)
        self.gnote(at.g, f"slot{s.idx} ack_mismatched prompt_index {[pi] * 3} sample_index "
                         f"{[si]}")
        self.count("ack_mismatched")

    def op_abort_own(self, s):
        atts = self.live_atts(s)
        if not atts:
            return self.op_pump()
        at = self.rng.choice(atts)
        at.aborting = True
        at.g.state = "aborting"
        s.wire.abort(at.g.gid)
        self.gnote(at.g, f"slot{s.idx} abort own")
        self.count("abort_own")

    def op_abort_other(self, s):
        other = set(self.other_gids(s))
        cands = [k[1] for k, g in sorted(self.groups.items())
                 if k[0] != s.client_id and g.state in ("live", "done") and k[1] in other and
                 k[1] not in s.expect_notfound]
        if not cands:
            return self.op_pump()
        gid = self.rng.choice(cands)
        s.expect_notfound[gid] = self.step
        s.wire.abort(gid)
        self.note(f"slot{s.idx} abort other's g{gid}")
        for k, g in self.groups.items():
            if k[1] == gid:
                self.gnote(g, f"slot{s.idx} ({s.client_id}) sends Abort of this group id")
        self.count("abort_other")

    def other_gids(self, s):
        """Group ids other owners use and this owner never does."""
        mine = {g for t in self.slots if t.client_id == s.client_id for g in t.gids}
        return sorted({g for t in self.slots if t.client_id != s.client_id
                       for g in t.gids} - mine)

    def op_status(self, s):
        rid = s.wire.send_status()
        s.pending_status[rid] = self.step
        self.count("status")

    def sync_status(self, s, timeout=WAIT_S):
        rid = s.wire.send_status()
        s.pending_status[rid] = self.step
        t0 = time.time()
        while rid in s.pending_status:
            if time.time() - t0 > timeout:
                return self.fail(f"slot{s.idx}: no StatusReply within {timeout:.0f} s")
            self.pump(s, 50)
        self.count("status")

    def op_update(self, s):
        if self.version is None:
            self.sync_status(s)
        v = self.version + 1
        drain = self.rng.random() < 0.5
        self.update_reply = None
        self.update_rid = s.wire.send_update(self.a.model, v, drain)
        self.note(f"slot{s.idx} UpdateWeights v{v} drain={drain}")
        t0 = time.time()
        while self.update_reply is None:
            if time.time() - t0 > WAIT_S:
                self.fail(f"UpdateWeights v{v} drain={drain}: no reply in {WAIT_S:.0f} s")
                break
            self.pump_all(20)
            self.pump(s, 0)
        else:
            if self.update_reply.kind == "ack" and self.update_reply.data != v:
                self.fail(f"UpdateWeights v{v}: Ack carries version {self.update_reply.data}")
            self.version = v
        self.update_rid = None
        self.count("update_drain" if drain else "update_nodrain")

    def wal_committed(self):
        """The WAL's committed LSN now (None: no reply), asked on a connection of its own."""
        w = oc.Wire(self.server.endpoint, "probe", self.ctx)
        try:
            data = oc.wait_status(w, 5.0)
            return None if data is None else data["wal_committed_lsn"]
        finally:
            w.close()

    def op_pump(self):
        self.pump_all(0)
        self.count("pump")

    def op_kill(self):
        committed = self.wal_committed()
        t_kill = time.time()
        self.sample_rss()
        self.server.kill9()
        self.kills += 1
        self.note(f"KILL -9 (kill #{self.kills})")
        for g in self.groups.values():
            g.hist.append(f"[{self.step}] KILL -9 (acks: {sorted(g.ack.items())})")
        self.count("kill9")
        for s in self.slots:
            if s.wire is not None:
                self.pump(s)       # what had already arrived belongs to the old attachments
        for g in self.groups.values():
            for p, a in list(g.ack.items()):
                if a[0] == "applied":
                    durable = (a[2] is not None and committed is not None and a[2] <= committed)
                    g.ack[p] = ("def",) if durable or t_kill - a[1] >= SETTLE else ("maybe",)
        for s in self.slots:
            self.disconnect(s, "service killed")
        self.version = None
        self.server.start()
        self.note("restart")
        for s in self.slots:
            if self.rng.random() < 0.85:
                self.reconnect(s)

    def reconnect(self, s):
        """A new connection with the same client_id re-attaches the unfinished groups, and
        (now and then) finished ones that still have unacknowledged trajectories."""
        self.connect(s)
        for k, g in sorted(self.groups.items()):
            if k[0] != s.client_id or g.gid not in s.gids:
                continue
            if g.state in ("live", "done") and all(p in g.ack for p in g.all):
                # Every trajectory is (maybe) acknowledged: the WAL may have compacted the whole
                # group, and what a re-send then means is not specified (a new group?); retire.
                self.gnote(g, "retired: every trajectory is (maybe) acknowledged")
                g.state = "retired"
                continue
            if g.state == "live":
                self.attach(s, g)
            elif g.state == "done" and self.rng.random() < 0.5:
                g.state = "live"
                self.attach(s, g)
        self.count("reconnect")

    # ---- driver ----

    def pick(self, s):
        ops = [("submit", 12), ("pump", 20), ("status", 10), ("ack_late", 14),
               ("ack_early", 4), ("ack_twice", 3), ("ack_range", 3), ("ack_other", 2),
               ("ack_mismatched", 1), ("abort_own", 2), ("abort_other", 3), ("update", 1.5),
               ("disconnect", 2.5), ("pause", 2), ("sleep", 6),
               ("reattach_done", self.a.resubmit_done_weight),
               ("kill", self.a.kill_weight)]
        off = set(filter(None, self.a.ops_off.split(",")))
        ops = [(n, 0.0 if n in off else w) for n, w in ops]
        tot = sum(w for _, w in ops)
        x = self.rng.random() * tot
        for name, w in ops:
            x -= w
            if x < 0:
                return name
        return "pump"

    def run_step(self):
        # The op and its slot come from a stream that depends on (seed, step) only; the targets
        # (which group, which samples) from a per-step stream, so that timing never shifts the
        # ops of later steps.
        pick = random.Random(self.a.seed * 1000003 + self.step)
        s = pick.choice(self.slots)
        self.rng = pick
        op = self.pick(s)
        if s.wire is None:
            if op in ("sleep", "kill", "pump"):
                pass
            else:
                return self.reconnect(s)
        if op == "submit":
            self.op_submit(s)
        elif op == "pump":
            self.op_pump()
        elif op == "status":
            self.op_status(s)
        elif op.startswith("ack_"):
            if op == "ack_mismatched":
                self.op_ack_mismatched(s)
            else:
                self.op_ack(s, op[4:])
        elif op == "abort_own":
            self.op_abort_own(s)
        elif op == "abort_other":
            self.op_abort_other(s)
        elif op == "update":
            self.op_update(s)
        elif op == "disconnect":
            self.disconnect(s, "client closed its socket")
            self.count("disconnect")
        elif op == "pause":
            s.paused_until = self.step + self.rng.randrange(5, 60)
            self.note(f"slot{s.idx} stops reading until step {s.paused_until}")
            self.count("pause")
        elif op == "sleep":
            time.sleep(self.rng.choice([0.005, 0.02, 0.05]))
            self.op_pump()
        elif op == "reattach_done":
            self.op_reattach_done(s)
        elif op == "kill":
            self.op_kill()

    def finish(self):
        """Every client re-attaches what is unfinished; everything not aborted must complete."""
        self.note("final phase")
        for s in self.slots:
            s.paused_until = -1
            if s.wire is None:
                self.reconnect(s)
        t0 = time.time()
        while True:
            self.pump_all(20)
            open_ = [(s, at) for s in self.slots for at in s.att.values() if not at.done]
            if not open_:
                break
            if time.time() - t0 > WAIT_S:
                for s, at in open_:
                    self.fail(g=at.g, msg=f"frozen: slot{s.idx} group {at.g.gid}: "
                              f"{'abort: ' if at.aborting else ''}got {len(at.got)} of "
                              f"{len(at.expect)} expected trajectories and no GroupDone within "
                              f"{WAIT_S:.0f} s of the final re-attach (attached at step "
                              f"{at.step})")
                break
        left = [g for g in self.groups.values() if g.state == "live"]
        for g in left:
            self.fail(f"group {g.gid} of {g.owner} never completed")
        for s in self.slots:
            for gid in list(s.expect_notfound):
                self.fail(f"slot{s.idx}: Abort of another owner's group {gid} got no "
                          "Error NotFound")
            self.sync_status(s)
            for gid in list(s.expect_notfound):
                self.fail(f"slot{s.idx}: Abort of another owner's group {gid} got no "
                          "Error NotFound")
        self.sample_rss()

    def run(self):
        with oc.TempDir("bitroll_model_") as tmp:
            self.refs = oc.References(self.a.bitroll, self.a.model, tmp)
            t0 = time.time()
            for r in self.recipes:
                self.refs.get(r)
            t_ref = time.time() - t0
            self.server = oc.Server(self.a.bitroll, self.a.model,
                                    data_dir=os.path.join(tmp, "data"),
                                    log=os.path.join(tmp, "serve.log"),
                                    extra=self.a.serve_args.split())
            try:
                self.server.start()
                for s in self.slots:
                    self.connect(s)
                t1 = time.time()
                try:
                    for self.step in range(self.a.steps):
                        self.run_step()
                        if self.step % 25 == 0:
                            self.sample_rss()
                            if not self.server.alive():
                                self.fail("bitroll serve died by itself:\n" +
                                          self.server.log_tail())
                                break
                    self.step = self.a.steps
                    self.finish()
                except Failure:
                    pass
                secs = time.time() - t1
            finally:
                log_tail = self.server.log_tail(3000)
                self.server.kill9()
                for s in self.slots:
                    if s.wire is not None:
                        s.wire.close()
                self.ctx.term()
        print(f"seed={self.a.seed} steps={self.step} ({secs:.1f} s, references {t_ref:.1f} s) "
              f"kills={self.kills} max RSS {oc.fmt_kb(self.max_rss)}")
        print("ops: " + ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())))
        if self.failures:
            print(f"FAILED seed={self.a.seed}: {len(self.failures)} check(s) failed; the first "
                  "of each kind:")
            kinds = set()
            for f in self.failures:
                kind = re.sub(r"[0-9]+", "N", f.split("\n")[0].split(": ", 1)[-1])[:60]
                if kind not in kinds and len(kinds) < 12:
                    kinds.add(kind)
                    print("  " + f)
            print("trace (last ops):")
            for line in self.trace[-self.a.trace:]:
                print("  " + line)
            print("service log tail:\n" + log_tail)
            print(f"replay: {sys.executable} {os.path.abspath(__file__)} --seed {self.a.seed} "
                  f"--steps {self.a.steps}")
            return 1
        print("PASS")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--kill-weight", type=float, default=0.6, help="relative weight of kill -9")
    ap.add_argument("--rss-mib", type=int, default=128, help="bound on the service's VmRSS")
    ap.add_argument("--resubmit-done-weight", type=float, default=0.0,
                    help="relative weight of re-sending a finished group on the same connection")
    ap.add_argument("--serve-args", default="", help="extra `bitroll serve` flags")
    ap.add_argument("--keep-going", action="store_true", help="record failures, do not stop")
    ap.add_argument("--ops-off", default="", help="comma-separated ops never drawn (to narrow a "
                    "failure down), e.g. update,abort_other,ack_other,kill")
    ap.add_argument("--trace", type=int, default=40, help="ops of trace printed on failure")
    a = oc.parse_args(ap)
    if a is None:
        return 0
    return Model(a).run()


if __name__ == "__main__":
    sys.exit(main())
