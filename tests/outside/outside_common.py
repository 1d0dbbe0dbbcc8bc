"""Shared pieces of the outside-in tests (tests/outside/): they drive `bitroll serve` only through
its public surface, the `bitroll` CLI and the wire protocol (docs/protocol.md), as a careless or
hostile client would.

Finds the binary from --bitroll / $BITROLL_EXE and the model from --model / $BITROLL_MODELS_DIR
(default ../shared/models beside the checkout, as cmake/bitroll.cmake does). Every server runs in
its own process group and is killed on exit; every wait has a timeout.
"""

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
try:  # the installed package, or <build>/python on PYTHONPATH (ctest sets it)
    import bitroll
except ImportError as e:
    sys.exit(f"outside tests: cannot import the bitroll package ({e}): set "
             "PYTHONPATH=<build>/python (ctest does) or install it with `pip install ./python`")
import numpy as np  # noqa: E402
import zmq  # noqa: E402
from bitroll import messages, protocol as proto  # noqa: E402

__all__ = ["bitroll", "np", "proto", "zmq"]  # the tests use them as oc.bitroll, oc.proto, ...

M = proto.Message
ERR = messages.ERROR_NAMES  # code value -> CamelCase name


def default_bitroll():
    for p in (os.environ.get("BITROLL_EXE"), os.path.join(ROOT, "build", "rollout", "bitroll"),
              os.path.join(ROOT, "build-c", "rollout", "bitroll")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def default_model():
    d = os.environ.get("BITROLL_MODELS_DIR") or os.path.join(ROOT, "..", "shared", "models")
    return os.path.abspath(os.path.join(d, "stories260K.bin"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


_LIVE = []  # servers to kill at exit, whatever happens


@atexit.register
def _kill_all():
    for s in list(_LIVE):
        s.kill9()


def _on_term(signum, frame):
    raise SystemExit(128 + signum)   # runs the finally blocks and atexit: servers die too


signal.signal(signal.SIGTERM, _on_term)


class Server:
    """`bitroll serve` on a fixed 127.0.0.1 port (so that a restart reuses it)."""

    def __init__(self, bitroll, model, data_dir=None, extra=(), replicas=1, port=None, log=None):
        self.bitroll, self.model, self.data_dir = bitroll, model, data_dir
        self.extra, self.replicas = list(extra), replicas
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.proc = None
        self.log = log or tempfile.mktemp(prefix="bitroll_outside_", suffix=".log")
        self.starts = 0

    def argv(self):
        a = [self.bitroll, "serve", "--model", self.model, "--replicas", str(self.replicas),
             "--threads", "1", "--bind", self.endpoint, "--log-level", "info"]
        if self.data_dir:
            a += ["--data-dir", self.data_dir]
        return a + self.extra

    def start(self, timeout=30.0):
        self.starts += 1
        logf = open(self.log, "ab")
        logf.write(f"==== start {self.starts}: {' '.join(self.argv())}\n".encode())
        logf.flush()
        deadline = time.time() + timeout
        while True:
            # stdout and stderr both go to the log file: a pipe nobody drains after start-up would
            # fill with the service's log lines and block it.
            begin = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            self.proc = subprocess.Popen(self.argv(), stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            _LIVE.append(self)
            while time.time() < deadline:
                with open(self.log, "rb") as f:
                    f.seek(begin)
                    if b"bitroll serve: clients" in f.read():
                        logf.close()
                        return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            rc = self.proc.poll()
            self.kill9()
            tail = self.log_tail()
            if rc is not None and "Address already in use" in tail and time.time() < deadline:
                time.sleep(0.2)  # the killed server's port is not free yet
                continue
            logf.close()
            raise RuntimeError(f"bitroll serve did not start (rc={rc}): {' '.join(self.argv())}"
                               f"\n{tail}")

    def log_tail(self, n=2000):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def rss_kb(self):
        return rss_kb(self.proc.pid) if self.alive() else None

    def kill9(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if self in _LIVE:
            _LIVE.remove(self)
        try:
            self.proc.stdout.close()
        except Exception:
            pass


def supports_flag(bitroll, model, flag, value):
    """Whether `bitroll serve` knows FLAG (it refuses unknown flags at once, exit 2)."""
    p = subprocess.run([bitroll, "serve", "--model", model, "--replicas", "0",
                        "--bind", "tcp://127.0.0.1:1", flag, value, "--bogus-probe", "x"],
                       capture_output=True, timeout=30)
    return f"unknown flag {flag}" not in p.stderr.decode(errors="replace")


# ---- the wire: a raw client that records every message it gets --------------------------------

class Event:
    __slots__ = ("kind", "gid", "rid", "data", "t")

    def __init__(self, kind, gid, rid, data):
        self.kind, self.gid, self.rid, self.data, self.t = kind, gid, rid, data, time.time()

    def __repr__(self):
        return f"{self.kind}(g={self.gid}, rid={self.rid}, {self.data})"


def parse(data, light=False):
    """One message from the service -> Event (kind: trajectory, group_done, error, ack, status).
    light: a Trajectory's data is only its group id (fast, for floods)."""
    if not proto.Envelope.EnvelopeBufferHasIdentifier(data, 0):
        return Event("bad", 0, 0, "no BRL1 identifier")
    env = proto.Envelope.GetRootAs(data, 0)
    t, rid = env.MsgType(), env.RequestId()
    if t == M.Trajectory:
        tr = messages.table(env, proto.Trajectory)
        if light:
            return Event("trajectory", tr.GroupId(), rid, None)
        traj = messages.trajectory(tr)
        return Event("trajectory", traj.group_id, rid, traj)
    if t == M.GroupDone:
        d = messages.table(env, proto.GroupDone)
        return Event("group_done", d.GroupId(), rid,
                     {"trajectories": d.Trajectories(), "errors": d.Errors(),
                      "aborted": d.Aborted()})
    if t == M.Error:
        e = messages.table(env, proto.Error)
        return Event("error", e.GroupId(), rid, (ERR.get(e.Code(), str(e.Code())),
                                                  (e.Message() or b"").decode(errors="replace")))
    if t == M.Ack:
        a = messages.table(env, proto.Ack)
        return Event("ack", a.GroupId(), rid, a.WeightVersion())
    if t == M.StatusReply:
        s = messages.table(env, proto.StatusReply)
        return Event("status", 0, rid, {"queued": s.Queued(), "inflight": s.Inflight(),
                                        "groups": s.Groups(), "weight_version": s.WeightVersion(),
                                        "draining": s.Draining(),
                                        "trajectories_done": s.TrajectoriesDone(),
                                        "waiting_for_weights": s.WaitingForWeights(),
                                        "wal_enabled": s.WalEnabled(),
                                        "wal_last_lsn": s.WalLastLsn(),
                                        "wal_committed_lsn": s.WalCommittedLsn()})
    if t == M.TokenChunk:
        c = messages.table(env, proto.TokenChunk)
        return Event("chunk", c.GroupId(), rid, None)
    return Event("other", 0, rid, t)


class Wire:
    """One DEALER connection with a client_id; sends through bitroll.Client's builders and
    receives raw (nothing is dropped: a message for a group it never submitted is recorded)."""

    def __init__(self, endpoint, client_id, ctx, light=False):
        self.light = light
        self.c = bitroll.Client(endpoint, timeout_ms=1000, context=ctx, client_id=client_id)
        self.sock = self.c._sock
        self.client_id = client_id
        self.held = []  # events wait_status read past while it looked for its reply

    def close(self):
        self.c.close()

    def submit(self, gid, spec, **kw):
        self.c.submit(spec["prompts"], n=spec["n"], params=spec["params"], seed=spec["seed"],
                      max_tokens=spec["max_tokens"], group_id=gid, **kw)

    def abort(self, gid):
        self.c.abort(gid)

    def ack(self, gid, pairs):
        self.c.ack(gid, pairs)

    def send_status(self):
        return self.c._send(M.Status, proto.StatusT())

    def send_update(self, path, version, drain):
        u = proto.UpdateWeightsT()
        u.path, u.version, u.drain = path, version, drain
        return self.c._send(M.UpdateWeights, u)

    def recv_all(self, timeout_ms=0, max_msgs=100000):
        out, self.held = self.held[:max_msgs], self.held[max_msgs:]
        while len(out) < max_msgs and self.sock.poll(timeout_ms if not out else 0):
            out.append(parse(self.sock.recv(), self.light))
        return out


# ---- references: `bitroll generate --json` ------------------------------------------------------

def wait_status(wire, timeout=10.0, poll_ms=20):
    """Sends Status on `wire` and returns its StatusReply's data, or None after `timeout` s.
    Replies come in order, so everything the service answered before it has arrived too; those
    other events stay for the wire's next recv_all."""
    rid = wire.send_status()
    t0 = time.time()
    kept, wire.held = wire.held, []  # recv_all below then reads the socket only
    try:
        while time.time() - t0 < timeout:
            evs = wire.recv_all(poll_ms)
            for i, ev in enumerate(evs):
                if ev.kind == "status" and ev.rid == rid:
                    kept += evs[:i] + evs[i + 1:]
                    return ev.data
            kept += evs
        return None
    finally:
        wire.held = kept + wire.held


def standard_parser(doc):
    """The parser an outside test starts from: --bitroll and --model with their defaults."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--bitroll", default=default_bitroll())
    ap.add_argument("--model", default=default_model())
    return ap


def parse_args(ap):
    """ap.parse_args() plus the checks every outside test makes; None: skip (said loudly)."""
    a = ap.parse_args()
    if not a.bitroll or not os.access(a.bitroll, os.X_OK):
        ap.error("no bitroll executable: pass --bitroll or set BITROLL_EXE")
    if not os.path.exists(a.model):
        print(f"SKIPPED LOUDLY: model {a.model} not found (BITROLL_MODELS_DIR)")
        return None
    return a


def report(name, failures, t0):
    """Prints the verdict of a test that collected `failures`; returns its exit status."""
    print(f"{name}: {time.time() - t0:.1f} s")
    if failures:
        print(f"FAILED: {len(failures)} check(s):")
        for f in failures:
            print("  " + f)
        return 1
    print("PASS")
    return 0


class References:
    """Trajectories of `bitroll generate --json`, once per distinct (prompts, params, seed,
    max_tokens, n), cached in memory: key -> {(prompt_index, sample_index): (ids, bits)}.
    `extra`: more `generate` flags (engine settings such as --kv-dtype bf16)."""

    def __init__(self, bitroll, model, tmp, extra=()):
        self.bitroll, self.model, self.tmp = bitroll, model, tmp
        self.extra = list(extra)
        self.cache = {}

    @staticmethod
    def key(spec):
        p = spec["params"]
        return (tuple(tuple(x) for x in spec["prompts"]), p.get("temperature", 1.0),
                p.get("top_k", 0), p.get("top_p", 1.0), p.get("min_p", 0.0), spec["seed"],
                spec["max_tokens"], spec["n"])

    def get(self, spec):
        k = self.key(spec)
        if k not in self.cache:
            path = os.path.join(self.tmp, f"prompts_{id(self)}_{len(self.cache)}.jsonl")
            with open(path, "w") as f:
                for pr in spec["prompts"]:
                    f.write(json.dumps({"ids": list(pr)}) + "\n")
            p = spec["params"]
            argv = [self.bitroll, "generate", "--model", self.model, "--prompts", path, "--json",
                    "-n", str(spec["n"]), "--max-tokens", str(spec["max_tokens"]),
                    "--temperature", repr(float(p.get("temperature", 1.0))),
                    "--top-k", str(int(p.get("top_k", 0))),
                    "--top-p", repr(float(p.get("top_p", 1.0))),
                    "--min-p", repr(float(p.get("min_p", 0.0))), "--seed", str(spec["seed"])]
            argv += self.extra
            r = subprocess.run(argv, capture_output=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"bitroll generate failed: {' '.join(argv)}\n"
                                   f"{r.stderr.decode(errors='replace')}")
            ref = {}
            for line in r.stdout.decode().splitlines():
                j = json.loads(line)
                ref[(j["prompt_index"], j["sample_index"])] = (
                    list(j["ids"]), [int(b, 16) for b in j["logprob_bits"]])
            self.cache[k] = ref
        return self.cache[k]

    def check(self, spec, traj):
        """None when traj's ids and logprob bits equal generate's, else a one-line reason."""
        ref = self.get(spec).get((traj.prompt_index, traj.sample_index))
        if ref is None:
            return f"no reference for prompt {traj.prompt_index} sample {traj.sample_index}"
        ids = traj.ids.tolist()
        bits = traj.logprobs.view(np.uint32).tolist()
        if ids != ref[0]:
            return f"ids differ from generate: got {ids[:12]}.. want {ref[0][:12]}.."
        if bits != ref[1]:
            i = next(i for i in range(len(bits)) if bits[i] != ref[1][i])
            return f"logprob bits differ at {i}: {bits[i]:08x} vs {ref[1][i]:08x}"
        return None


class TempDir:
    def __init__(self, prefix):
        self.path = tempfile.mkdtemp(prefix=prefix)

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def fmt_kb(kb):
    return "?" if kb is None else f"{kb / 1024:.1f} MiB"
