"""Pinned protocol scenarios of `bitroll serve --data-dir`, from outside (issue 12).

Each scenario is a short deterministic script over the wire protocol (the same rules as
protocol_model_test.py, which finds such cases at random); one line of verdict each:

  ack_durable_after_kill     acks committed (StatusReply.wal_committed_lsn past them) before kill -9
                             are not delivered again on re-attach
  ack_durable_two_kills      the same across two kill -9 / restarts
  ack_after_reattach_durable an Ack of a trajectory re-delivered after a restart is durable too
  other_owner_abort_recovered another owner's Abort/Ack of a recovered (not re-attached) group
                             touch nothing
  ack_twice_then_kill        an Ack repeated shortly before kill -9 undoes nothing
  reattach_finished_after_reconnect  a finished, partly acknowledged group re-attached from a
                             new connection (no restart) delivers only the unacknowledged ones
  ack_on_reattached_finished_then_kill  Acks sent on such a re-attached group survive kill -9
  ack_out_of_range           out-of-range / 2^32-1 indexes acknowledge nothing
  ack_mismatched_lengths     an Ack whose prompt_index and sample_index differ in length is
                             ignored, or zipped to the shorter list; nothing else is acknowledged
  other_owner_ack            another client_id's Ack of the same group id touches nothing
  other_owner_abort          another client_id's Abort gets Error NotFound; the group completes
  same_gid_two_owners        two owners, one group id, concurrently: two separate groups
  early_ack                  an Ack before delivery is ignored (delivery and re-attach unchanged)
  reattach_live_group        close the socket mid-group, reconnect with the same client_id,
                             re-send the SubmitRollouts: every trajectory exactly once, GroupDone
  stale_submit_after_reattach  an older connection's Submit handled after the re-attach of
                             the owner's newer connection leaves the group with the newer one
  stale_submit_after_finish  the same once the group finished on the newer connection:
                             FailedPrecondition, nothing to the older one
  reattach_after_kill        kill -9 mid-group, restart, re-attach: every trajectory exactly once
  ack_on_resumed_then_kill   Acks of trajectories finished after a restart (resumed from the WAL)
                             survive the next kill -9
  nowal_vanished_aborted     (no --data-dir) a vanished client's group is aborted; re-sending it
                             runs it afresh
  resubmit_finished          re-send a finished, partly acknowledged group on the same connection:
                             the acknowledged one never comes again

    /usr/bin/python3 tests/outside/protocol_scenarios_test.py --bitroll build/rollout/bitroll \
        [--only NAME]
Exit 0 = all pass, 1 = some failed.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

WAIT = 20.0
SPEC = {"prompts": [[1, 42, 43, 44], [1, 300, 301]], "n": 2, "seed": 77,
        "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, "max_tokens": 16}
ALL = {(p, s) for p in range(2) for s in range(2)}
SLOW = dict(SPEC, n=4, max_tokens=200, prompts=[[1, 5, 6]])


class Check(Exception):
    pass


class Env:
    def __init__(self, a, tmp, wal=True):
        self.a, self.tmp = a, tmp
        self.ctx = oc.zmq.Context()
        self.srv = oc.Server(a.bitroll, a.model,
                             data_dir=os.path.join(tmp, "data") if wal else None,
                             log=os.path.join(tmp, "serve.log"))
        self.srv.start()
        self.refs = oc.References(a.bitroll, a.model, tmp)
        self.wires = []

    def wire(self, cid):
        w = oc.Wire(self.srv.endpoint, cid, self.ctx)
        self.wires.append(w)
        return w

    def close(self):
        for w in self.wires:
            w.close()
        self.srv.kill9()
        self.ctx.destroy(0)

    def restart(self):
        self.srv.kill9()
        self.srv.start()

    def collect(self, w, gid, timeout=WAIT, until_done=True, stop_after=None):
        """Trajectories of gid on w (list), GroupDone (or None), other events."""
        t0 = time.time()
        trajs, done, other = [], None, []
        while time.time() - t0 < timeout:
            for ev in w.recv_all(20):
                if ev.kind == "trajectory" and ev.gid == gid:
                    trajs.append(ev.data)
                    if stop_after and len(trajs) >= stop_after:
                        return trajs, done, other
                elif ev.kind == "group_done" and ev.gid == gid:
                    done = ev.data
                else:
                    other.append(ev)
            if done is not None and until_done:
                break
        return trajs, done, other

    def sync(self, w):
        data = oc.wait_status(w, WAIT)
        if data is None:
            raise Check("no StatusReply")
        return data

    def run(self, name, gid, what, want, spec=SPEC):
        """A new connection of owner `name` submits (or re-attaches to) group `gid` and gets
        exactly `want`; returns the connection."""
        w = self.wire(name)
        w.submit(gid, spec)
        self.expect_exactly(what, *self.collect(w, gid)[:2], want, spec)
        return w

    def settle(self, w):
        """Waits until what `w` sent is in a committed WAL transaction: a StatusReply on w comes
        after the service handled it, and its wal_last_lsn covers it (StatusReply's contract)."""
        want = self.sync(w)["wal_last_lsn"]
        t0 = time.time()
        while self.sync(w)["wal_committed_lsn"] < want:
            if time.time() - t0 > WAIT:
                raise Check(f"the WAL did not commit up to {want} within {WAIT:.0f} s")
            time.sleep(0.002)

    def expect_exactly(self, what, trajs, done, want, spec=SPEC):
        got = [(t.prompt_index, t.sample_index) for t in trajs]
        if done is None:
            raise Check(f"{what}: no GroupDone within {WAIT:.0f} s (got {sorted(got)})")
        dup = sorted({p for p in got if got.count(p) > 1})
        if dup:
            raise Check(f"{what}: delivered twice: {dup}")
        if set(got) != set(want):
            extra = sorted(set(got) - set(want))
            missing = sorted(set(want) - set(got))
            raise Check(f"{what}: got {sorted(got)}; " +
                        (f"not expected (acknowledged or foreign): {extra}; " if extra else "") +
                        (f"missing: {missing}" if missing else ""))
        for t in trajs:
            why = self.refs.check(spec, t)
            if why:
                raise Check(f"{what}: trajectory {t.prompt_index}/{t.sample_index}: {why}")


def s_ack_durable_after_kill(e):
    a = e.run("A", 1, "first run", ALL)
    a.ack(1, [(0, 0), (1, 1)])
    e.settle(a)
    e.restart()
    a2 = e.run("A", 1, "re-attach after kill -9", ALL - {(0, 0), (1, 1)})


def s_ack_durable_two_kills(e):
    a = e.run("A", 1, "first run", ALL)
    a.ack(1, [(0, 0), (1, 1)])
    e.settle(a)
    e.restart()
    time.sleep(0.5)
    e.restart()
    a2 = e.run("A", 1, "re-attach after two kill -9", ALL - {(0, 0), (1, 1)})


def s_ack_after_reattach_durable(e):
    a = e.run("A", 1, "first run", ALL)
    e.restart()
    a2 = e.run("A", 1, "re-attach after kill -9", ALL)
    a2.ack(1, [(0, 1)])
    e.settle(a2)
    e.restart()
    a3 = e.run("A", 1, "second re-attach after an Ack of a re-delivered trajectory + kill -9",
                ALL - {(0, 1)})


def s_other_owner_abort_recovered(e):
    a = e.run("A", 1, "first run", ALL)
    a.ack(1, [(0, 0)])
    e.settle(a)
    e.restart()                      # group 1 is now recovered, not attached
    b = e.wire("B")
    b.abort(1)
    b.ack(1, [(0, 1)])
    e.settle(b)
    e.restart()
    a2 = e.run("A", 1, "A re-attaches after B's Abort+Ack of the recovered group + kill -9",
                ALL - {(0, 0)})


def s_ack_twice_then_kill(e):
    a = e.run("A", 1, "first run", ALL)
    a.ack(1, [(0, 0), (0, 1)])
    e.settle(a)
    a.ack(1, [(0, 0), (0, 1)])
    e.sync(a)
    time.sleep(0.1)
    e.restart()
    a2 = e.run("A", 1, "re-attach after an Ack sent twice + kill -9", ALL - {(0, 0), (0, 1)})


def s_reattach_finished_after_reconnect(e):
    a = e.run("A", 6, "first run", ALL)
    a.ack(6, [(1, 0), (0, 1), (0, 0)])
    e.sync(a)
    a.c.close()                      # the client vanishes; its finished group leaves memory
    a2 = e.run("A", 6, "re-attach of the finished group from a new connection", {(1, 1)})


def s_ack_on_reattached_finished_then_kill(e):
    a = e.run("A", 6, "first run", ALL)
    a.c.close()
    a2 = e.run("A", 6, "re-attach of the finished group", ALL)
    a2.ack(6, [(1, 0), (0, 1), (0, 0)])
    e.settle(a2)
    e.restart()
    a3 = e.run("A", 6, "re-attach after Acks on the re-attached group + kill -9", {(1, 1)})


def s_ack_out_of_range(e):
    a = e.run("A", 1, "first run", ALL)
    for pairs in ([(2**32 - 1, 2**32 - 1)], [(0, 2)], [(2, 0)], [(7, 9)], [(1, 2**32 - 1)],
                  [(2**32 - 1, 0)]):
        a.ack(1, pairs)
    e.settle(a)
    e.restart()
    a2 = e.run("A", 1, "re-attach after out-of-range Acks + kill -9", ALL)


def s_ack_mismatched_lengths(e):
    a = e.run("A", 1, "first run", ALL)
    for pi, si in (([1, 1, 1], [1]), ([1], [1, 1, 1]), ([], [1, 1]), ([1, 1], [])):
        m = oc.proto.AckT()           # prompt_index and sample_index of different lengths
        m.groupId, m.promptIndex, m.sampleIndex = 1, pi, si
        a.c._send(oc.M.Ack, m)
    e.settle(a)
    e.restart()
    a2 = e.wire("A")
    a2.submit(1, SPEC)
    e.expect_exactly("re-attach after Acks with index lists of different lengths + kill -9 "
                     "(refused: nothing acknowledged)", *e.collect(a2, 1)[:2], ALL)


def s_other_owner_ack(e):
    a, b = e.wire("A"), e.wire("B")
    a.submit(5, SPEC)
    e.expect_exactly("A's run", *e.collect(a, 5)[:2], ALL)
    b.ack(5, sorted(ALL))
    e.sync(b)
    a.c.close()
    a2 = e.run("A", 5, "A re-attaches after B's Ack (service alive)", ALL)
    a2.close()
    time.sleep(0.5)
    e.restart()
    a3 = e.run("A", 5, "A re-attaches after B's Ack + kill -9", ALL)


def s_other_owner_abort(e):
    a, b = e.wire("A"), e.wire("B")
    spec = dict(SPEC, max_tokens=64)
    a.submit(5, spec)
    b.abort(5)
    t0 = time.time()
    errs = []
    while time.time() - t0 < 5 and not errs:
        errs = [ev.data for ev in b.recv_all(50) if ev.kind == "error"]
    trajs, done, _ = e.collect(a, 5)
    if done and done["aborted"]:
        raise Check(f"B's Abort aborted A's group: GroupDone {done}")
    e.expect_exactly("A's group after B's Abort", trajs, done, ALL, spec)
    if not errs or errs[0][0] != "NotFound":
        raise Check(f"B's Abort of a group it does not own: want Error NotFound, got {errs}")


def s_same_gid_two_owners(e):
    a, b = e.wire("A"), e.wire("B")
    spec_b = dict(SPEC, seed=78, prompts=[[1, 9, 10], [1, 11]])
    a.submit(3, SPEC)
    b.submit(3, spec_b)
    ra, rb = e.collect(a, 3), e.collect(b, 3)
    e.expect_exactly("owner A, group 3", ra[0], ra[1], ALL, SPEC)
    e.expect_exactly("owner B, group 3", rb[0], rb[1], ALL, spec_b)


def s_early_ack(e):
    a = e.wire("A")
    a.submit(2, SPEC)
    a.ack(2, sorted(ALL))          # before anything can have been delivered
    e.expect_exactly("delivery after an early Ack", *e.collect(a, 2)[:2], ALL)
    a.c.close()
    a2 = e.run("A", 2, "re-attach after an early Ack", ALL)


def s_reattach_live_group(e):
    a = e.wire("A")
    a.submit(4, SLOW)
    first, _, _ = e.collect(a, 4, stop_after=1)
    if not first:
        raise Check("no first trajectory")
    a.c.close()
    a2 = e.wire("A")
    a2.submit(4, SLOW)
    want = {(0, s) for s in range(4)}
    e.expect_exactly("re-attach of a live group after reconnect", *e.collect(a2, 4)[:2],
                     want, SLOW)


def s_stale_submit_after_reattach(e):
    """A connection closed right after a Submit may have it still in flight: ZeroMQ orders
    messages per connection only, so the coordinator can handle it after the Submit with which
    the owner's next connection re-attached. The group must stay with the newer connection."""
    old = e.wire("A")
    e.sync(old)                    # the older connection is known to the service
    new = e.wire("A")
    new.submit(6, SLOW)
    e.sync(new)                    # the newer connection's Submit is handled first ...
    old.submit(6, SLOW)            # ... then the old one's, as when it arrives late
    want = {(0, s) for s in range(4)}
    trajs, done, _ = e.collect(new, 6)
    e.expect_exactly("the newer connection after a late Submit of the older one", trajs, done,
                     want, SLOW)
    late = [ev for ev in old.recv_all(200) if ev.kind in ("trajectory", "group_done")]
    if late:
        raise Check(f"the older connection took the group back: {len(late)} messages")


def s_stale_submit_after_finish(e):
    """The same late Submit of an older connection, once the group has finished on the newer
    one (it is parked): refused with FailedPrecondition, the older connection gets nothing."""
    old = e.wire("A")
    e.sync(old)                    # the older connection is known to the service
    new = e.wire("A")
    new.submit(7, SPEC)
    e.expect_exactly("the newer connection's run", *e.collect(new, 7)[:2], ALL)
    old.submit(7, SPEC)            # arrives late, after the group finished
    e.sync(old)
    late = old.recv_all(200)
    got = [ev for ev in late if ev.kind in ("trajectory", "group_done")]
    if got:
        raise Check(f"the older connection took the finished group back: {len(got)} messages")
    errs = [ev.data for ev in late if ev.kind == "error"]
    if not errs or errs[0][0] != "FailedPrecondition":
        raise Check(f"late Submit of an older connection: want Error FailedPrecondition, "
                    f"got {errs}")


def s_reattach_after_kill(e):
    a = e.wire("A")
    a.submit(4, SLOW)
    first, _, _ = e.collect(a, 4, stop_after=1)
    e.restart()
    a2 = e.wire("A")
    a2.submit(4, SLOW)
    want = {(0, s) for s in range(4)}
    e.expect_exactly("re-attach after kill -9 mid-group", *e.collect(a2, 4)[:2], want, SLOW)


def s_ack_on_resumed_then_kill(e):
    a = e.wire("A")
    a.submit(4, SLOW)
    first, _, _ = e.collect(a, 4, stop_after=1)
    e.restart()                       # kill -9 mid-group: the rest resumes from the WAL
    a2 = e.wire("A")
    a2.submit(4, SLOW)
    want = {(0, s) for s in range(4)}
    e.expect_exactly("re-attach after kill -9 mid-group", *e.collect(a2, 4)[:2], want, SLOW)
    a2.ack(4, [(0, 0), (0, 1), (0, 2)])
    e.settle(a2)
    e.restart()
    a3 = e.run("A", 4, "re-attach after Acks of resumed trajectories + kill -9", {(0, 3)}, SLOW)


def s_resubmit_finished(e):
    a = e.run("A", 6, "first run", ALL)
    a.ack(6, [(0, 0)])
    e.sync(a)
    a.submit(6, SPEC)
    e.expect_exactly("same connection re-sends the finished group", *e.collect(a, 6)[:2],
                     ALL - {(0, 0)})


def s_nowal_vanished_aborted(e):
    """(no --data-dir) A client vanishes mid-group: its group is aborted (Status.groups drops to
    0, nothing runs on), and the same client_id re-sending the group gets a fresh, whole run."""
    a = e.wire("A")
    a.submit(4, SLOW)
    first, _, _ = e.collect(a, 4, stop_after=1)
    if not first:
        raise Check("no first trajectory")
    a.c.close()
    b = e.wire("B")
    t0 = time.time()
    st = e.sync(b)
    while time.time() - t0 < 10 and (st["groups"] or st["inflight"] or st["queued"]):
        time.sleep(0.2)
        st = e.sync(b)
    if st["groups"] or st["inflight"] or st["queued"]:
        raise Check(f"10 s after its client vanished the group still runs: {st}")
    a2 = e.run("A", 4, "the same client_id re-sends the group", {(0, s) for s in range(4)}, SLOW)


SCENARIOS = [(n[2:], f) for n, f in list(globals().items()) if n.startswith("s_")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--only")
    a = oc.parse_args(ap)
    if a is None:
        return 0
    failed = 0
    t0 = time.time()
    for name, f in SCENARIOS:
        if a.only and a.only != name:
            continue
        with oc.TempDir(f"bitroll_scn_{name}_") as tmp:
            e = Env(a, tmp, wal=not name.startswith("nowal_"))
            t1 = time.time()
            try:
                f(e)
                print(f"PASS {name} ({time.time() - t1:.1f} s)", flush=True)
            except Check as ex:
                failed += 1
                print(f"FAIL {name}: {ex}", flush=True)
            finally:
                e.close()
    print(f"protocol_scenarios_test: {time.time() - t0:.1f} s, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
