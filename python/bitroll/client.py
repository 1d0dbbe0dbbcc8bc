"""The client of the bitroll rollout service (docs/protocol.md).

Runs on Debian's /usr/bin/python3 with python3-zmq, python3-flatbuffers and python3-numpy.

    from bitroll import Client
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

import itertools
import secrets
import time
from collections import deque

import flatbuffers
import numpy as np
import zmq

from . import messages
from . import protocol as p
from .errors import BitrollError
from .protocol import Message


def encode(msg_type, msg, request_id, client_id):
    """One message as bytes: an Envelope (identifier BRL1, PROTOCOL_VERSION) around `msg`, an
    object-API table (e.g. SubmitRolloutsT) whose union type is `msg_type` (a Message value)."""
    b = flatbuffers.Builder(1024)
    env = p.EnvelopeT()
    env.protocolVersion = p.PROTOCOL_VERSION
    env.requestId = request_id
    env.clientId = client_id
    env.msgType = msg_type
    env.msg = msg
    b.Finish(env.Pack(b), file_identifier=p.FILE_IDENTIFIER)
    return bytes(b.Output())


def submit_rollouts(group_id, prompts, n=1, params=None, seed=0, max_tokens=256, stop_ids=(),
                    stop_strings=(), stop_at_eos=True, max_turns=1, priority=0, client_tag="",
                    stream_tokens=False, tools=(), tool_open=None, tool_close=None,
                    tool_open_id=-1, tool_close_id=-1, tool_result_template=None,
                    return_routing=False):
    """The SubmitRolloutsT that Client.submit sends (same arguments)."""
    params = params or {}
    m = p.SubmitRolloutsT()
    m.groupId = group_id
    m.prompts = []
    for pr in prompts:
        pt = p.PromptT()
        if isinstance(pr, str):
            pt.text = pr
        else:
            pt.ids = [int(x) for x in pr]
        m.prompts.append(pt)
    m.n = n
    sp = p.SamplingParamsT()
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
    m.returnRouting = bool(return_routing)
    tiers = {v: k for k, v in messages.TIER_NAMES.items()}
    m.tools = []
    for t in tools:
        ts = p.ToolSpecT()
        ts.name = t["name"]
        ts.tier = tiers[t.get("tier", "function")]
        ts.commandTemplate = t.get("command_template")
        ts.function = t.get("function")
        lim = p.ToolLimitsT()
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
    return m


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
        rid = next(self._request_ids)
        self._sock.send(encode(msg_type, obj, rid, self.client_id))
        return rid

    def send_raw(self, data):
        """Sends arbitrary bytes as one message (for tests of malformed input)."""
        self._sock.send(data)

    def submit(self, prompts, n=1, params=None, seed=0, max_tokens=256, group_id=None,
               stop_ids=(), stop_strings=(), stop_at_eos=True, max_turns=1, priority=0,
               client_tag="", stream_tokens=False, tools=(), tool_open=None, tool_close=None,
               tool_open_id=-1, tool_close_id=-1, tool_result_template=None,
               return_routing=False):
        """Submits prompts (lists of token ids, or strings) x n samples. Returns a Group.

        return_routing (mixture-of-experts models): each Trajectory carries `routing`, the top-k
        expert ids and fp32 weights per position and MoE layer (Trajectory.routing).

        Tool loop (docs/protocol.md "Tools"): `tools` is a list of dicts {"name", "tier"
        ("function" | "process" | "container" | "vm"), "function" or "command_template",
        optional limits "wall_ms", "cpu_ms", "memory_bytes", "output_bytes", "processes",
        "network"}; a call is the text between tool_open and tool_close (or the tokens
        tool_open_id .. tool_close_id); max_turns bounds the model turns.
        """
        m = submit_rollouts(
            next(self._group_ids) if group_id is None else group_id, prompts, n=n,
            params=params, seed=seed, max_tokens=max_tokens, stop_ids=stop_ids,
            stop_strings=stop_strings, stop_at_eos=stop_at_eos, max_turns=max_turns,
            priority=priority, client_tag=client_tag, stream_tokens=stream_tokens, tools=tools,
            tool_open=tool_open, tool_close=tool_close, tool_open_id=tool_open_id,
            tool_close_id=tool_close_id, tool_result_template=tool_result_template,
            return_routing=return_routing)
        g = Group(self, m.groupId)
        self._groups[m.groupId] = g
        self._send(Message.SubmitRollouts, m)
        return g

    def abort(self, group_id):
        a = p.AbortT()
        a.groupId = group_id
        self._send(Message.Abort, a)

    def ack(self, group_id, samples):
        a = p.AckT()
        a.groupId = group_id
        a.promptIndex = [p for p, _ in samples]
        a.sampleIndex = [s for _, s in samples]
        self._send(Message.Ack, a)

    def update_weights(self, path, version, drain=False):
        """Loads weights from `path` on every replica; returns the live version."""
        u = p.UpdateWeightsT()
        u.path = path
        u.version = version
        u.drain = drain
        rid = self._send(Message.UpdateWeights, u)
        env = self._wait_reply(rid)
        return messages.table(env, p.Ack).WeightVersion()

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
                f = p.TensorFrameT()
                f.name, f.dtype, f.shape, f.offset = name, dtype, shape, off
                f.data = raw[off:off + take]
                frames.append(f)
                budget -= take
                off += take
                if off == len(raw):
                    ti, off = ti + 1, 0
            last = ti == len(items)
            u = p.UpdateWeightsT()
            u.version, u.drain, u.tensors, u.more, u.full, u.part = (
                version, drain and last, frames, not last, full, part)
            part += 1
            try:
                live = self.wait_update_reply(self._send(Message.UpdateWeights, u))
            except BitrollError:
                a = p.UpdateWeightsT()
                a.version, a.abort = version, True
                self._send(Message.UpdateWeights, a)  # best effort; the reply is not awaited
                raise
            if last:
                return live

    def begin_update_weights_nccl(self, unique_id, world_size, manifest, version, drain=False):
        """Announces an NCCL broadcast (unique_id: the 128 ncclUniqueId bytes of the trainer,
        rank 0; world_size: 1 + live replicas; manifest: [(name, dtype, shape)] in broadcast
        order). Returns the request id; wait_update_reply() gives the outcome.
        bitroll.nccl.broadcast_weights_nccl drives the whole broadcast."""
        if len(unique_id) != 128:
            raise ValueError("unique_id must have 128 bytes")
        n = p.NcclWeightsT()
        n.uniqueId = np.frombuffer(bytes(unique_id), dtype=np.uint8)
        n.worldSize = world_size
        n.tensors = []
        for name, dtype, shape in manifest:
            f = p.TensorFrameT()
            f.name, f.dtype, f.shape = name, dtype, list(shape)
            n.tensors.append(f)
        u = p.UpdateWeightsT()
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
        return messages.table(env, p.Ack).WeightVersion()

    def drain(self, resume=False):
        d = p.DrainT()
        d.resume = resume
        self._wait_reply(self._send(Message.Drain, d))

    def status(self):
        env = self._wait_reply(self._send(Message.Status, p.StatusT()))
        return messages.status_reply(messages.table(env, p.StatusReply))

    def wait_committed(self, timeout_ms=None):
        """Returns once everything this client sent before the call (acks, aborts, submits) is in
        a committed WAL transaction, so that it survives kill -9 of the service: e.g. before the
        trainer checkpoints what it acknowledged. BitrollError("failed_precondition") without a
        WAL, the WAL's own error once it has failed, BitrollError("timeout") after timeout_ms
        (default: the client's timeout_ms)."""
        deadline = time.monotonic() + (self.timeout_ms if timeout_ms is None else timeout_ms) / 1e3
        first = now = self.status()  # its wal_last_lsn covers what was sent before (in order)
        if not first["wal_enabled"]:
            raise BitrollError("failed_precondition",
                               "wait_committed: the service runs without a WAL (--data-dir)")
        while True:
            if now["wal_error"] is not None:
                raise now["wal_error"]
            if now["wal_committed_lsn"] >= first["wal_last_lsn"]:
                return
            if time.monotonic() >= deadline:
                raise BitrollError("timeout", f"wait_committed: the WAL committed up to "
                                   f"{now['wal_committed_lsn']} of {first['wal_last_lsn']}")
            time.sleep(0.002)
            now = self.status()

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
        env = messages.decode(self._sock.recv())
        t = env.MsgType()
        if t == Message.Trajectory:
            traj = messages.trajectory(messages.table(env, p.Trajectory))
            g = self._groups.get(traj.group_id)
            if g is not None:
                g._events.append(("trajectory", traj))
        elif t == Message.TokenChunk:
            c = messages.token_chunk(messages.table(env, p.TokenChunk))
            g = self._groups.get(c.group_id)
            if g is not None:
                g.chunks.append(c)
        elif t == Message.GroupDone:
            d = messages.table(env, p.GroupDone)
            g = self._groups.pop(d.GroupId(), None)
            if g is not None:
                g.summary = messages.group_done(d)
                g._done = True
        elif t == Message.Error:
            err = messages.error(messages.table(env, p.Error))
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
