"""Python client of the bitroll rollout service (docs/protocol.md).

Runs on Debian's /usr/bin/python3 with python3-zmq, python3-flatbuffers and python3-numpy.
The FlatBuffers Python module is generated from schema/rollout.fbs with flatc at import time into
a cache folder keyed by the schema's hash (generated code is never committed). Set BITROLL_FBS to
point at the schema when this file is used outside the source tree, and BITROLL_FLATC for flatc.

    client = Client("tcp://127.0.0.1:5555")
    group = client.submit([[1, 2, 3]], n=8, params={"temperature": 1.0}, seed=7, max_tokens=64)
    for traj in group:          # trajectories as they finish
        print(traj.sample_index, traj.ids, traj.logprobs)
    print(group.summary)        # GroupDone: counts and summed cost
    client.update_weights("/path/to/weights.bin", version=2, drain=True)
    client.update_weights_tensors([("norm.weight", np.ones(64, np.float32))], version=3)
    print(client.status())

A Client is not thread-safe: use one per thread.

Owners: every message carries the Client's `client_id` (Envelope.client_id), a string that names
the owner of the groups it submits, acknowledges or aborts; groups are keyed by (client_id,
group_id). Client(endpoint, client_id=None) picks a random 128-bit hex id (`client.client_id`).
To re-attach to a group after a service restart (`--data-dir`) or after reconnecting, create the
new Client with the same client_id and re-send the same SubmitRollouts (same group_id): it
delivers every trajectory delivered before and not acknowledged, the rest as they finish, then
GroupDone. Another client_id can neither see, acknowledge nor abort the group.
"""

import hashlib
import itertools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import zmq

PROTOCOL_VERSION = 1
_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_wire():
    fbs = os.environ.get("BITROLL_FBS") or os.path.join(_HERE, "..", "..", "schema", "rollout.fbs")
    fbs = os.path.abspath(fbs)
    with open(fbs, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    out = os.path.join(tempfile.gettempdir(), f"bitroll_fbs_py_{digest}")
    if not os.path.isdir(os.path.join(out, "bitroll", "wire")):
        flatc = os.environ.get("BITROLL_FLATC") or shutil.which("flatc")
        if flatc is None:
            raise RuntimeError("flatc not found: install flatbuffers-compiler or set BITROLL_FLATC")
        tmp = tempfile.mkdtemp(prefix="bitroll_fbs_tmp_")
        subprocess.run([flatc, "--python", "--gen-object-api", "-o", tmp, fbs], check=True)
        try:
            os.rename(tmp, out)  # atomic: concurrent importers race harmlessly
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    if out not in sys.path:
        sys.path.insert(0, out)
    import bitroll.wire as wire  # noqa: E402  (generated)
    from bitroll.wire import (Abort, Ack, Drain, Envelope, Error, ErrorCode,  # noqa: F401
                              FinishReason, GroupDone, Message, Prompt, SamplingParams,
                              Status, StatusReply, SubmitRollouts, TokenChunk, ToolTier,
                              Trajectory, UpdateWeights)
    return wire


wire = _load_wire()
from bitroll.wire.Envelope import Envelope, EnvelopeT  # noqa: E402
from bitroll.wire.Message import Message  # noqa: E402
from bitroll.wire.Prompt import PromptT  # noqa: E402
from bitroll.wire.SamplingParams import SamplingParamsT  # noqa: E402
from bitroll.wire.SubmitRollouts import SubmitRolloutsT  # noqa: E402
from bitroll.wire.Abort import AbortT  # noqa: E402
from bitroll.wire.UpdateWeights import UpdateWeightsT  # noqa: E402
from bitroll.wire.TensorFrame import TensorFrameT  # noqa: E402
from bitroll.wire.NcclWeights import NcclWeightsT  # noqa: E402
from bitroll.wire.Status import StatusT  # noqa: E402
from bitroll.wire.Drain import DrainT  # noqa: E402
from bitroll.wire.Ack import AckT  # noqa: E402
from bitroll.wire.ToolSpec import ToolSpecT  # noqa: E402
from bitroll.wire.ToolLimits import ToolLimitsT  # noqa: E402
from bitroll.wire.Trajectory import Trajectory as _Trajectory  # noqa: E402
from bitroll.wire.TokenChunk import TokenChunk as _TokenChunk  # noqa: E402
from bitroll.wire.GroupDone import GroupDone as _GroupDone  # noqa: E402
from bitroll.wire.Error import Error as _Error  # noqa: E402
from bitroll.wire.StatusReply import StatusReply as _StatusReply  # noqa: E402
from bitroll.wire.Ack import Ack as _Ack  # noqa: E402

_ERROR_NAMES = {v: k for k, v in vars(wire.ErrorCode.ErrorCode).items() if not k.startswith("_")}


def _snake(name):
    return "".join(("_" + c.lower()) if c.isupper() and i else c.lower() for i, c in enumerate(name))


# "length", "stop", "eos", "aborted", "error", "tool_call", ...
_FINISH_NAMES = {v: _snake(k.rstrip("_")) for k, v in vars(wire.FinishReason.FinishReason).items()
                 if not k.startswith("_")}


class BitrollError(Exception):
    """A typed error from the service. `code` is the snake-case name of bitroll::ErrorCode."""

    def __init__(self, code, message, group_id=0):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.group_id = group_id


def _cost(c):
    if c is None:
        return {}
    return {
        "prefill_computed": c.PrefillComputed(), "prefill_cached": c.PrefillCached(),
        "decode_tokens": c.DecodeTokens(), "engine_seconds": c.EngineSeconds(),
        "queue_seconds": c.QueueSeconds(), "sandbox_seconds": c.SandboxSeconds(),
        "sandbox_cpu_seconds": c.SandboxCpuSeconds(), "wal_bytes": c.WalBytes(),
        "price_usd": c.PriceUsd(),
    }


def _err(e):
    return BitrollError(_snake(_ERROR_NAMES.get(e.Code(), "Internal")),
                        (e.Message() or b"").decode(), e.GroupId())


@dataclass
class Trajectory:
    group_id: int
    prompt_index: int
    sample_index: int
    ids: np.ndarray        # int32
    logprobs: np.ndarray   # float32, bit-exact as produced
    finish: str
    turns: int
    versions: list         # [(first token index, weight version)]
    cost: dict
    replica: str
    client_tag: str
    fingerprint: dict
    error: object = None   # BitrollError when finish == "error"
    # Tool loop: mask[i] = 1 for a sampled token, 0 for an injected one (tool result, logprob
    # 0.0); tool_calls: one dict per call (name, input, tier, exit_status, output,
    # output_truncated, error, wall_seconds, cpu_seconds, token_index, replayed).
    mask: np.ndarray = None
    tool_calls: list = None

    def to_json(self):
        """One JSON Lines record (the input of `bitroll cost`); logprob bits are exact hex."""
        import json
        return json.dumps({
            "group_id": self.group_id, "prompt_index": self.prompt_index,
            "sample_index": self.sample_index, "ids": self.ids.tolist(),
            "logprobs": self.logprobs.tolist(),
            "logprob_bits": [f"{b:08x}" for b in self.logprobs.view(np.uint32).tolist()],
            "finish": self.finish, "turns": self.turns, "versions": self.versions,
            "cost": self.cost, "replica": self.replica, "client_tag": self.client_tag,
            "fingerprint": self.fingerprint,
            "mask": [] if self.mask is None else self.mask.tolist(),
            "tool_calls": [{**c, "error": None if c["error"] is None else str(c["error"])}
                           for c in (self.tool_calls or [])]})


@dataclass
class TokenChunk:
    group_id: int
    prompt_index: int
    sample_index: int
    position_begin: int
    ids: np.ndarray
    logprobs: np.ndarray
    weight_version: int
    injected_ids: np.ndarray = None  # tool loop: result tokens inserted at position_begin


def _vec(table, name):
    if getattr(table, name + "IsNone")():
        return None
    return getattr(table, name + "AsNumpy")()


_TIER_NAMES = {v: k.lower() for k, v in vars(wire.ToolTier.ToolTier).items()
               if not k.startswith("_")}


def _tool_call(c):
    return {"name": (c.Name() or b"").decode(), "input": (c.Input() or b"").decode(),
            "tier": _TIER_NAMES.get(c.Tier(), "function"), "exit_status": c.ExitStatus(),
            "output": (c.Output() or b"").decode(errors="replace"),
            "output_truncated": c.OutputTruncated(),
            "error": None if c.Error() is None else _err(c.Error()),
            "wall_seconds": c.WallSeconds(), "cpu_seconds": c.CpuSeconds(),
            "token_index": c.TokenIndex(), "replayed": c.Replayed()}


def _trajectory(t):
    ids = _vec(t, "Ids")
    lps = _vec(t, "Logprobs")
    mask = _vec(t, "Mask")
    fp = t.Fingerprint()
    return Trajectory(
        group_id=t.GroupId(), prompt_index=t.PromptIndex(), sample_index=t.SampleIndex(),
        ids=np.array([], np.int32) if ids is None else np.asarray(ids, np.int32).copy(),
        logprobs=np.array([], np.float32) if lps is None else np.asarray(lps, np.float32).copy(),
        finish=_FINISH_NAMES.get(t.Finish(), "none"), turns=t.Turns(),
        versions=[(t.Versions(i).Begin(), t.Versions(i).Version()) for i in range(t.VersionsLength())],
        cost=_cost(t.Cost()), replica=(t.Replica() or b"").decode(),
        client_tag=(t.ClientTag() or b"").decode(),
        fingerprint={} if fp is None else {"weights_hash": fp.WeightsHash(),
                                           "kernel_version": fp.KernelVersion(),
                                           "attention_chunk": fp.AttentionChunk(),
                                           "backend": (fp.Backend() or b"").decode()},
        error=None if t.Error() is None else _err(t.Error()),
        mask=(np.ones(0 if ids is None else len(ids), np.uint8) if mask is None
              else np.asarray(mask, np.uint8).copy()),
        tool_calls=[_tool_call(t.ToolCalls(i)) for i in range(t.ToolCallsLength())])


class Group:
    """Handle of one submitted group: iterate for trajectories as they finish."""

    def __init__(self, client, group_id):
        self._client = client
        self.group_id = group_id
        self._events = deque()
        self.summary = None       # dict from GroupDone once the group is done
        self.chunks = []          # TokenChunk events when stream_tokens=True
        self._done = False

    def __iter__(self):
        while True:
            while not self._events:
                if self._done:
                    return
                self._client._pump(self._client.timeout_ms)
            kind, value = self._events.popleft()
            if kind == "trajectory":
                yield value
            elif kind == "error":
                self._done = True
                raise value

    def result(self):
        """All trajectories, sorted by (prompt_index, sample_index), after GroupDone."""
        out = list(self)
        out.sort(key=lambda t: (t.prompt_index, t.sample_index))
        return out


class Client:
    def __init__(self, endpoint="tcp://127.0.0.1:5555", timeout_ms=60000, context=None,
                 client_id=None):
        """client_id: the owner id sent with every message (a random 128-bit hex string when
        None); reuse it to re-attach to this client's groups (see the module docstring)."""
        self.client_id = secrets.token_hex(16) if client_id is None else str(client_id)
        self.timeout_ms = timeout_ms
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._groups = {}
        self._replies = {}
        self._waiting_rid = None
        self.unsolicited_errors = deque()  # errors for no group / control call (send_raw)
        self._request_ids = itertools.count(1)
        self._group_ids = itertools.count(1)

    def close(self):
        self._sock.close(0)

    # ---- sending ----

    def _send(self, msg_type, obj):
        b = flatbuffers.Builder(1024)
        env = EnvelopeT()
        env.protocolVersion = PROTOCOL_VERSION
        env.requestId = next(self._request_ids)
        env.clientId = self.client_id
        env.msgType = msg_type
        env.msg = obj
        b.Finish(env.Pack(b), file_identifier=b"BRL1")
        self._sock.send(bytes(b.Output()))
        return env.requestId

    def send_raw(self, data):
        """Sends arbitrary bytes as one message (for tests of malformed input)."""
        self._sock.send(data)

    def submit(self, prompts, n=1, params=None, seed=0, max_tokens=256, group_id=None,
               stop_ids=(), stop_strings=(), stop_at_eos=True, max_turns=1, priority=0,
               client_tag="", stream_tokens=False, tools=(), tool_open=None, tool_close=None,
               tool_open_id=-1, tool_close_id=-1, tool_result_template=None):
        """Submits prompts (lists of token ids, or strings) x n samples. Returns a Group.

        Tool loop (docs/protocol.md "Tools"): `tools` is a list of dicts {"name", "tier"
        ("function" | "process" | "container" | "vm"), "function" or "command_template",
        optional limits "wall_ms", "cpu_ms", "memory_bytes", "output_bytes", "processes",
        "network"}; a call is the text between tool_open and tool_close (or the tokens
        tool_open_id .. tool_close_id); max_turns bounds the model turns.
        """
        params = params or {}
        m = SubmitRolloutsT()
        m.groupId = next(self._group_ids) if group_id is None else group_id
        m.prompts = []
        for p in prompts:
            pt = PromptT()
            if isinstance(p, str):
                pt.text = p
            else:
                pt.ids = [int(x) for x in p]
            m.prompts.append(pt)
        m.n = n
        sp = SamplingParamsT()
        sp.temperature = float(params.get("temperature", 1.0))
        sp.topK = int(params.get("top_k", 0))
        sp.topP = float(params.get("top_p", 1.0))
        sp.minP = float(params.get("min_p", 0.0))
        m.sampling = sp
        m.seed = seed
        m.maxTokens = max_tokens
        m.maxTurns = max_turns
        m.stopIds = [int(x) for x in stop_ids]
        m.stopStrings = list(stop_strings)
        m.stopAtEos = stop_at_eos
        m.priority = priority
        m.clientTag = client_tag
        m.streamTokens = stream_tokens
        tiers = {v: k for k, v in _TIER_NAMES.items()}
        m.tools = []
        for t in tools:
            ts = ToolSpecT()
            ts.name = t["name"]
            ts.tier = tiers[t.get("tier", "function")]
            ts.commandTemplate = t.get("command_template")
            ts.function = t.get("function")
            lim = ToolLimitsT()
            for key, attr in (("wall_ms", "wallMs"), ("cpu_ms", "cpuMs"),
                              ("memory_bytes", "memoryBytes"), ("output_bytes", "outputBytes"),
                              ("processes", "processes"), ("network", "network")):
                if key in t:
                    setattr(lim, attr, t[key])
            ts.limits = lim
            m.tools.append(ts)
        if not m.tools:
            m.tools = None
        m.toolOpen = tool_open
        m.toolClose = tool_close
        m.toolOpenId = tool_open_id
        m.toolCloseId = tool_close_id
        m.toolResultTemplate = tool_result_template
        g = Group(self, m.groupId)
        self._groups[m.groupId] = g
        self._send(Message.SubmitRollouts, m)
        return g

    def abort(self, group_id):
        a = AbortT()
        a.groupId = group_id
        self._send(Message.Abort, a)

    def ack(self, group_id, samples):
        a = AckT()
        a.groupId = group_id
        a.promptIndex = [p for p, _ in samples]
        a.sampleIndex = [s for _, s in samples]
        self._send(Message.Ack, a)

    def update_weights(self, path, version, drain=False):
        """Loads weights from `path` on every replica; returns the live version."""
        u = UpdateWeightsT()
        u.path = path
        u.version = version
        u.drain = drain
        rid = self._send(Message.UpdateWeights, u)
        env = self._wait_reply(rid)
        ack = _Ack()
        ack.Init(env.Msg().Bytes, env.Msg().Pos)
        return ack.WeightVersion()

    def update_weights_tensors(self, tensors, version, drain=False, full=False,
                               part_bytes=1 << 20):
        """Streams tensors to every replica and installs them under `version`.

        tensors: iterable of (name, array) or (name, array, dtype). `array` is a numpy array
        (float32 -> "f32", float16 -> "f16"); bfloat16 goes as a uint16 array of its bits with
        dtype "bf16". Names are those of the served model's format (docs/weights.md). Tensors
        not sent keep their values; full=True makes the replicas check that every tensor was
        sent. Parts of at most part_bytes are acknowledged one by one; on an error the stream is
        aborted and nothing is installed. Returns the live version.
        """
        if not 4096 <= part_bytes <= (48 << 20):
            raise ValueError("part_bytes must be in [4096, 48 MiB]")
        items = []
        for t in tensors:
            name, arr = t[0], np.ascontiguousarray(t[1])
            dtype = t[2] if len(t) > 2 else {np.dtype(np.float32): "f32",
                                              np.dtype(np.float16): "f16"}.get(arr.dtype)
            if dtype not in ("f32", "f16", "bf16"):
                raise ValueError(f"tensor {name}: unsupported dtype {arr.dtype}")
            items.append((name, dtype, list(arr.shape), arr.reshape(-1).view(np.uint8)))
        part, ti, off = 0, 0, 0
        while True:
            frames, budget = [], part_bytes
            while ti < len(items) and budget > 0:
                name, dtype, shape, raw = items[ti]
                es = 4 if dtype == "f32" else 2
                take = min(len(raw) - off, budget)
                if take < len(raw) - off:
                    take -= take % es
                if take == 0 and len(raw) > 0:
                    break
                f = TensorFrameT()
                f.name, f.dtype, f.shape, f.offset = name, dtype, shape, off
                f.data = raw[off:off + take]
                frames.append(f)
                budget -= take
                off += take
                if off == len(raw):
                    ti, off = ti + 1, 0
            last = ti == len(items)
            u = UpdateWeightsT()
            u.version, u.drain, u.tensors, u.more, u.full, u.part = (
                version, drain and last, frames, not last, full, part)
            part += 1
            try:
                live = self.wait_update_reply(self._send(Message.UpdateWeights, u))
            except BitrollError:
                a = UpdateWeightsT()
                a.version, a.abort = version, True
                self._send(Message.UpdateWeights, a)  # best effort; the reply is not awaited
                raise
            if last:
                return live

    def begin_update_weights_nccl(self, unique_id, world_size, manifest, version, drain=False):
        """Announces an NCCL broadcast (unique_id: the 128 ncclUniqueId bytes of the trainer,
        rank 0; world_size: 1 + live replicas; manifest: [(name, dtype, shape)] in broadcast
        order). Returns the request id; wait_update_reply() gives the outcome.
        examples/python/nccl_update_weights.py drives the whole broadcast."""
        if len(unique_id) != 128:
            raise ValueError("unique_id must have 128 bytes")
        n = NcclWeightsT()
        n.uniqueId = np.frombuffer(bytes(unique_id), dtype=np.uint8)
        n.worldSize = world_size
        n.tensors = []
        for name, dtype, shape in manifest:
            f = TensorFrameT()
            f.name, f.dtype, f.shape = name, dtype, list(shape)
            n.tensors.append(f)
        u = UpdateWeightsT()
        u.version, u.drain, u.nccl = version, drain, n
        return self._send(Message.UpdateWeights, u)

    def wait_update_reply(self, rid, timeout_ms=None):
        """The live version once the update `rid` is installed everywhere; raises the update's
        BitrollError, or BitrollError("timeout") when no reply came within timeout_ms (0 polls)."""
        if timeout_ms is not None:
            self._waiting_rid = rid
            try:
                while rid not in self._replies:
                    if not self._sock.poll(timeout_ms):
                        raise BitrollError("timeout", f"no reply within {timeout_ms} ms")
                    self._pump(0)
            finally:
                self._waiting_rid = None
            env = self._replies.pop(rid)
            if isinstance(env, BitrollError):
                raise env
        else:
            env = self._wait_reply(rid)
        ack = _Ack()
        ack.Init(env.Msg().Bytes, env.Msg().Pos)
        return ack.WeightVersion()

    def drain(self, resume=False):
        d = DrainT()
        d.resume = resume
        self._wait_reply(self._send(Message.Drain, d))

    def status(self):
        env = self._wait_reply(self._send(Message.Status, StatusT()))
        s = _StatusReply()
        s.Init(env.Msg().Bytes, env.Msg().Pos)
        replicas = []
        for i in range(s.ReplicasLength()):
            r = s.Replicas(i)
            replicas.append({"name": (r.Name() or b"").decode(), "queued": r.Queued(),
                             "running": r.Running(), "tokens_per_s": r.TokensPerS(),
                             "weight_version": r.WeightVersion(), "alive": r.Alive(),
                             "remote": r.Remote()})
        return {"queued": s.Queued(), "inflight": s.Inflight(), "groups": s.Groups(),
                "replicas": replicas, "tokens_per_s": s.TokensPerS(),
                "cache_hit_rate": s.CacheHitRate(), "trajectories_done": s.TrajectoriesDone(),
                "weight_version": s.WeightVersion(), "draining": s.Draining(),
                "waiting_for_weights": s.WaitingForWeights()}

    # ---- receiving ----

    def next_error(self):
        """The next error not tied to a group or a control call (e.g. after send_raw)."""
        while not self.unsolicited_errors:
            self._pump(self.timeout_ms)
        return self.unsolicited_errors.popleft()

    def _wait_reply(self, rid):
        self._waiting_rid = rid
        try:
            while rid not in self._replies:
                self._pump(self.timeout_ms)
        finally:
            self._waiting_rid = None
        env = self._replies.pop(rid)
        if isinstance(env, BitrollError):
            raise env
        return env

    def _pump(self, timeout_ms):
        """Receives one message and routes it to its group or reply slot."""
        if not self._sock.poll(timeout_ms):
            raise BitrollError("timeout", f"no message within {timeout_ms} ms")
        data = self._sock.recv()
        if not Envelope.EnvelopeBufferHasIdentifier(data, 0):
            raise BitrollError("protocol", "reply lacks the BRL1 identifier")
        env = Envelope.GetRootAs(data, 0)
        if env.ProtocolVersion() != PROTOCOL_VERSION:
            raise BitrollError("protocol", f"protocol version {env.ProtocolVersion()}")
        t = env.MsgType()
        tab = env.Msg()
        if t == Message.Trajectory:
            tr = _Trajectory()
            tr.Init(tab.Bytes, tab.Pos)
            traj = _trajectory(tr)
            g = self._groups.get(traj.group_id)
            if g is not None:
                g._events.append(("trajectory", traj))
        elif t == Message.TokenChunk:
            c = _TokenChunk()
            c.Init(tab.Bytes, tab.Pos)
            g = self._groups.get(c.GroupId())
            if g is not None:
                ids = _vec(c, "Ids")
                lps = _vec(c, "Logprobs")
                inj = _vec(c, "InjectedIds")
                g.chunks.append(TokenChunk(c.GroupId(), c.PromptIndex(), c.SampleIndex(),
                                           c.PositionBegin(),
                                           np.asarray([] if ids is None else ids, np.int32),
                                           np.asarray([] if lps is None else lps, np.float32),
                                           c.WeightVersion(),
                                           None if inj is None else np.asarray(inj, np.int32)))
        elif t == Message.GroupDone:
            d = _GroupDone()
            d.Init(tab.Bytes, tab.Pos)
            g = self._groups.pop(d.GroupId(), None)
            if g is not None:
                g.summary = {"trajectories": d.Trajectories(), "errors": d.Errors(),
                             "aborted": d.Aborted(), "cost": _cost(d.Cost())}
                g._done = True
        elif t == Message.Error:
            e = _Error()
            e.Init(tab.Bytes, tab.Pos)
            err = _err(e)
            if self._waiting_rid is not None and env.RequestId() == self._waiting_rid:
                self._replies[env.RequestId()] = err
            elif err.group_id in self._groups:
                self._groups.pop(err.group_id)._events.append(("error", err))
            else:
                self.unsolicited_errors.append(err)
        elif t in (Message.Ack, Message.StatusReply):
            self._replies[env.RequestId()] = env
        else:
            raise BitrollError("protocol", f"unexpected message type {t}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
