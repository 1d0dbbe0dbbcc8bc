"""The replica link driven from outside, as a careless or hostile replica would: a process that
connects to `bitroll serve --replica-bind` and speaks the wire protocol from Python.

One real in-process replica serves; a fake replica on the replica endpoint
- says hello with another replica protocol version: it must get Error{Protocol} and not join;
- says hello with this version and the service's fingerprint: it joins and gets work;
- answers its work with garbage, one fake per kind: random bytes; a ReplicaResults whose finished
  envelope is not a FlatBuffer; well-formed finished trajectories for work ids it never got; and
  then goes silent (its work must move to the real replica).
Checked against a simple model: every sample of the client's group arrives exactly once, each with
the ids and logprob bits of `bitroll generate --json` (the garbage never reaches the client), and
the service still answers Status afterwards.

    /usr/bin/python3 tests/outside/hostile_replica_test.py --bitroll build/rollout/bitroll
Exit 0 = pass, 1 = a check failed.
"""

import os
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

from bitroll.client import encode  # noqa: E402
from bitroll.wire.Envelope import Envelope, EnvelopeT  # noqa: E402
from bitroll.wire.FinishedTrajectory import FinishedTrajectoryT  # noqa: E402
from bitroll.wire.ReplicaHeartbeat import ReplicaHeartbeatT  # noqa: E402
from bitroll.wire.ReplicaHello import ReplicaHelloT  # noqa: E402
from bitroll.wire.ReplicaResults import ReplicaResultsT  # noqa: E402
from bitroll.wire.Trajectory import TrajectoryT  # noqa: E402

zmq = oc.zmq
M = oc.M
PARAMS = {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def spec(gid):
    """Prompts of their own per group: dispatch prefers the replica that served a prompt before,
    so a new fake gets the second prompt's samples only if the prompt is new."""
    return {"prompts": [[1, 5, 9, gid], [1, 200, 17, gid]], "n": 6, "params": PARAMS, "seed": 7,
            "max_tokens": 24}


def replica_protocol():
    """kReplicaProtocolVersion, read from rollout/protocol.h of this checkout."""
    with open(os.path.join(oc.ROOT, "rollout", "protocol.h")) as f:
        m = re.search(r"kReplicaProtocolVersion = (\d+);", f.read())
    if m is None:
        sys.exit("hostile_replica: kReplicaProtocolVersion not found in rollout/protocol.h")
    return int(m.group(1))


REPLICA_PROTOCOL = replica_protocol()


def hello(name, fingerprint, replica_protocol):
    h = ReplicaHelloT()
    h.name, h.vocabSize, h.maxSeqLen, h.capacity = name, 512, 512, 64
    h.fingerprint, h.remote, h.eosId = fingerprint, True, -1
    h.replicaProtocol = replica_protocol
    return encode(M.ReplicaHello, h, 0, "")


def unpack(data):
    return EnvelopeT.InitFromObj(Envelope.GetRootAs(bytearray(data), 0))


def results(finished):
    r = ReplicaResultsT()
    r.finished = finished
    return encode(M.ReplicaResults, r, 0, "")


def finished(work_id, envelope):
    f = FinishedTrajectoryT()
    f.workId, f.envelope = work_id, list(envelope)
    return f


def heartbeat():
    return encode(M.ReplicaHeartbeat, ReplicaHeartbeatT(), 0, "")


def raw_status(wire, timeout=10.0):
    """The service's StatusReply as an object-API table (replicas with their names), or None."""
    rid = wire.send_status()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if wire.sock.poll(100):
            env = unpack(wire.sock.recv())
            if env.msgType == M.StatusReply and env.requestId == rid:
                return env.msg
    return None


def alive_names(wire):
    st = raw_status(wire)
    if st is None:
        return None
    return {(r.name.decode() if isinstance(r.name, bytes) else r.name)
            for r in (st.replicas or []) if r.alive}


def join(ctx, rep_ep, wire, name, fingerprint, failures):
    """A fake replica of this protocol: says hello, heartbeats until the service lists it."""
    fake = ctx.socket(zmq.DEALER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.connect(rep_ep)
    fake.send(hello(name, fingerprint, REPLICA_PROTOCOL))
    for _ in range(50):
        fake.send(heartbeat())
        names = alive_names(wire)
        if names is not None and name in names:
            return fake
        time.sleep(0.05)
    failures.append(f"{name}: a replica of this protocol and fingerprint did not join")
    fake.close()
    return None


def garbage(kind, work_ids):
    if kind == "random bytes":
        return os.urandom(64)
    if kind == "envelope not a flatbuffer":
        return results([finished(work_ids[0], b"not a flatbuffer at all")])
    # Well-formed trajectory envelopes, but for work ids the service never gave out.
    t = TrajectoryT()
    t.ids, t.logprobs = [1, 2, 3], [-0.5, -0.25, -1.0]
    env = encode(M.Trajectory, t, 0, "")
    return results([finished(10**12 + i, env) for i in range(3)])


def cycle(ctx, rep_ep, wire, fingerprint, gid, kind, refs, failures):
    """A fake joins, gets the second prompt's samples (the least loaded replica), answers them
    with `kind` of garbage and goes silent; the group must still arrive whole and exact."""
    fake = join(ctx, rep_ep, wire, f"fake-{gid}", fingerprint, failures)
    if fake is None:
        return
    wire.submit(gid, spec(gid))
    deadline = time.time() + 10
    answered = False
    while time.time() < deadline and not answered:
        if not fake.poll(100):
            fake.send(heartbeat())
            continue
        env = unpack(fake.recv())
        if env.msgType != M.ReplicaWork or not env.msg.items:
            continue
        fake.send(garbage(kind, [it.workId for it in env.msg.items]))
        answered = True
    if not answered:
        failures.append(f"{kind}: the fake replica got no work")
    want = refs.get(spec(gid))
    seen = {}
    done = False
    deadline = time.time() + 60
    while time.time() < deadline and not done:
        for ev in wire.recv_all(200):
            if ev.kind == "trajectory" and ev.gid == gid:
                k = (ev.data.prompt_index, ev.data.sample_index)
                seen[k] = seen.get(k, 0) + 1
                if k not in want:
                    failures.append(f"{kind}: unexpected sample {k}")
                    continue
                ids, bits = want[k]
                got_bits = [int(b) for b in oc.np.asarray(ev.data.logprobs, oc.np.float32)
                            .view(oc.np.uint32)]
                if list(ev.data.ids) != ids or got_bits != bits:
                    failures.append(f"{kind}: sample {k} is not generate's ids and logprob bits")
            elif ev.kind == "group_done" and ev.gid == gid:
                done = True
    if not done:
        failures.append(f"{kind}: the group never finished")
    for k in want:
        if seen.get(k, 0) != 1:
            failures.append(f"{kind}: sample {k} arrived {seen.get(k, 0)} times, not once")
    fake.close()


def main():
    ap = oc.standard_parser(__doc__)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    failures = []
    tmp_dir = oc.TempDir("bitroll_hostile_replica_")
    rep_ep = f"tcp://127.0.0.1:{oc.free_port()}"
    srv = oc.Server(a.bitroll, a.model, replicas=1,
                    extra=["--replica-bind", rep_ep, "--replica-timeout-ms", "1500"]).start()
    ctx = zmq.Context()
    wire = oc.Wire(srv.endpoint, "innocent", ctx)
    try:
        st = raw_status(wire)
        fingerprint = st.fingerprint if st is not None else None
        if fingerprint is None:
            return oc.report("hostile_replica", ["no StatusReply with a fingerprint"], t0)

        # Another replica protocol: Error{Protocol}, not admitted.
        old = ctx.socket(zmq.DEALER)
        old.setsockopt(zmq.LINGER, 0)
        old.connect(rep_ep)
        old.send(hello("old", fingerprint, REPLICA_PROTOCOL - 1))
        if not old.poll(10000):
            failures.append("a replica of another protocol got no answer")
        else:
            env = unpack(old.recv())
            if env.msgType != M.Error or oc.ERR.get(env.msg.code) != "Protocol":
                failures.append(f"a replica of another protocol got message type {env.msgType},"
                                " not Error{Protocol}")
        names = alive_names(wire)
        if names is None or "old" in names:
            failures.append(f"a replica of another protocol is listed: {names}")
        old.close()

        refs = oc.References(a.bitroll, a.model, tmp_dir.path)
        for gid, kind in enumerate(["random bytes", "envelope not a flatbuffer",
                                    "results for unknown work ids"], start=40):
            cycle(ctx, rep_ep, wire, fingerprint, gid, kind, refs, failures)
        if raw_status(wire) is None or not srv.alive():
            failures.append("the service no longer answers Status")
    finally:
        wire.close()
        shutil.rmtree(tmp_dir.path, ignore_errors=True)
        if failures:
            print(srv.log_tail(3000))
        srv.kill9()
    return oc.report("hostile_replica", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
