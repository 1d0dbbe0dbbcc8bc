"""What the service sends, as Python values: Trajectory, TokenChunk, costs and typed errors.

Decodes the generated tables (bitroll.protocol) into plain dataclasses with numpy arrays; the
ids are int32 and the logprobs float32, bit-exact as the service produced them.
"""

import json
from dataclasses import dataclass

import numpy as np

from . import protocol as p
from .errors import BitrollError


def decode(data):
    """The Envelope of one received message; BitrollError("protocol") if it is not ours."""
    if not p.Envelope.EnvelopeBufferHasIdentifier(data, 0):
        raise BitrollError("protocol", "reply lacks the BRL1 identifier")
    env = p.Envelope.GetRootAs(data, 0)
    if env.ProtocolVersion() != p.PROTOCOL_VERSION:
        raise BitrollError("protocol", f"protocol version {env.ProtocolVersion()}")
    return env


def table(env, cls):
    """The Envelope's message read as the generated table class `cls` (e.g. Trajectory)."""
    t = cls()
    tab = env.Msg()
    t.Init(tab.Bytes, tab.Pos)
    return t


def _snake(name):
    return "".join(("_" + c.lower()) if c.isupper() and i else c.lower()
                   for i, c in enumerate(name))


def _names(enum_class):
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_")}


ERROR_NAMES = _names(p.ErrorCode)  # code value -> CamelCase name of bitroll::ErrorCode
# "length", "stop", "eos", "aborted", "error", "tool_call", ...
FINISH_NAMES = {v: _snake(k.rstrip("_")) for v, k in _names(p.FinishReason).items()}
TIER_NAMES = {v: k.lower() for v, k in _names(p.ToolTier).items()}  # "function", "process", ...
# snake-case name -> schema/status.h number (the wire ErrorCode has the same numbering)
ERROR_CODES = {_snake(k): v for v, k in ERROR_NAMES.items()}
# rollout/tool_call.h kDefaultResultTemplate
DEFAULT_RESULT_TEMPLATE = "\n<result>{output}</result>\n"


def error(e):
    """The BitrollError of an Error table."""
    return BitrollError(_snake(ERROR_NAMES.get(e.Code(), "Internal")),
                        (e.Message() or b"").decode(), e.GroupId())


def cost(c):
    """The Cost table as a dict ({} when absent)."""
    if c is None:
        return {}
    return {
        "prefill_computed": c.PrefillComputed(), "prefill_cached": c.PrefillCached(),
        "decode_tokens": c.DecodeTokens(), "engine_seconds": c.EngineSeconds(),
        "queue_seconds": c.QueueSeconds(), "sandbox_seconds": c.SandboxSeconds(),
        "sandbox_cpu_seconds": c.SandboxCpuSeconds(), "wal_bytes": c.WalBytes(),
        "price_usd": c.PriceUsd(),
    }


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
    # return_routing on a MoE model: {"n_experts": E, "expert_ids": uint8 (E <= 256) or uint16
    # array [positions, layers, k], "weights": float32 array [positions, layers, k]} for every
    # position that entered the model (the prompt, then every id but the last); else None.
    routing: dict = None

    def to_json(self):
        """One JSON Lines record (the input of `bitroll cost`); logprob bits are exact hex."""
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
                           for c in (self.tool_calls or [])],
            **({} if self.routing is None else {"routing": routing_json(self.routing)})})

    def audit_record(self, prompt, params=None, seed=0, max_tokens=256, stop_ids=(),
                     stop_at_eos=True, tool_result_template=None):
        """The audit record (docs/audit.md, version 1) of this trajectory, as a dict.

        A trajectory does not repeat its request: pass what was submitted for it (the prompt of
        its prompt_index, as ids or text, and submit()'s params, seed, max_tokens, stop_ids,
        stop_at_eos, tool_result_template). The wire does not carry a tool's stderr, so when a
        call exited non-zero without a typed error the record leaves out tool_result_template
        (the audit then forces the injected tokens without re-deriving them)."""
        params = params or {}
        n = len(self.ids)
        mask = [1] * n if self.mask is None or len(self.mask) != n else \
            [int(m) for m in self.mask.tolist()]
        bits = self.logprobs.astype(np.float32).view(np.uint32).tolist()
        turn_begins = [0] + [i for i in range(1, n) if mask[i] == 0 and mask[i - 1] == 1]
        calls, derivable = [], True
        for k, c in enumerate(self.tool_calls or []):
            err = c.get("error")
            code = 0 if err is None else ERROR_CODES.get(err.code, ERROR_CODES["internal"])
            derivable = derivable and (err is not None or c["exit_status"] == 0)
            calls.append({"call_index": k, "token_index": c["token_index"], "name": c["name"],
                          "input": c["input"],
                          "result": {"exit_status": c["exit_status"], "stdout": c["output"],
                                     "stderr": "", "error": "" if err is None else str(err),
                                     "error_code": code,
                                     "error_message": "" if err is None else err.message}})
        f32 = lambda x: float(np.float32(x))  # noqa: E731 (the exact value of the fp32)
        rec = {
            "record_version": 1, "source": "client", "group_id": self.group_id,
            "prompt_index": self.prompt_index, "sample_index": self.sample_index,
            "ids": self.ids.tolist(), "mask": mask,
            "logprob_bits": [f"{b:08x}" if m else "00000000" for b, m in zip(bits, mask)],
            "logprobs": self.logprobs.tolist(), "turn_begins": turn_begins,
            "tool_calls": calls,
            "sampling": {"temperature": f32(params.get("temperature", 1.0)),
                         "top_k": int(params.get("top_k", 0)),
                         "top_p": f32(params.get("top_p", 1.0)),
                         "min_p": f32(params.get("min_p", 0.0))},
            "seed": str(int(seed)),
            "stop": {"max_tokens": int(max_tokens), "stop_ids": [int(x) for x in stop_ids],
                     "stop_at_eos": bool(stop_at_eos), "stop_at_bos": True},
            "weight_versions": [{"begin": b, "version": v} for b, v in self.versions] or
                               [{"begin": 0, "version": 0}],
            "fingerprint": {"weights_hash": f"{self.fingerprint.get('weights_hash', 0):016x}",
                            "kernel_version": self.fingerprint.get("kernel_version", 0),
                            "attention_chunk": self.fingerprint.get("attention_chunk", 0),
                            "backend": self.fingerprint.get("backend", "")},
            "finish": self.finish.replace("_", ""),
        }
        if isinstance(prompt, str):
            rec["prompt_text"] = prompt
        else:
            rec["prompt_ids"] = [int(x) for x in prompt]
        if calls and derivable:
            rec["tool_result_template"] = tool_result_template or DEFAULT_RESULT_TEMPLATE
        if self.routing is not None:
            rec["routing"] = routing_json(self.routing)
        return rec

    def to_audit_json(self, prompt, **request):
        """audit_record(prompt, **request) as one JSON Lines line (no newline)."""
        return json.dumps(self.audit_record(prompt, **request), ensure_ascii=False)


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


def tool_call(c):
    """One ToolCallInfo table as a dict."""
    return {"name": (c.Name() or b"").decode(), "input": (c.Input() or b"").decode(),
            "tier": TIER_NAMES.get(c.Tier(), "function"), "exit_status": c.ExitStatus(),
            "output": (c.Output() or b"").decode(errors="replace"),
            "output_truncated": c.OutputTruncated(),
            "error": None if c.Error() is None else error(c.Error()),
            "wall_seconds": c.WallSeconds(), "cpu_seconds": c.CpuSeconds(),
            "token_index": c.TokenIndex(), "replayed": c.Replayed()}


def routing(r):
    """A wire Routing table as Trajectory.routing (None when absent)."""
    if r is None:
        return None
    layers, k = r.NLayers(), r.K()
    ids = _vec(r, "IdsU8")
    if ids is None:
        ids = _vec(r, "IdsU16")
    w = _vec(r, "Weights")
    if ids is None or w is None or layers * k == 0:
        return None
    shape = (len(ids) // (layers * k), layers, k)
    return {"n_experts": r.NExperts(), "expert_ids": np.asarray(ids).copy().reshape(shape),
            "weights": np.asarray(w, np.float32).copy().reshape(shape)}


def routing_json(r):
    """Trajectory.routing as JSON: ids, and the weights as exact fp32 hex bits."""
    return {"n_experts": r["n_experts"], "shape": list(r["expert_ids"].shape),
            "expert_ids": r["expert_ids"].reshape(-1).tolist(),
            "weight_bits": [f"{b:08x}" for b in r["weights"].view(np.uint32).reshape(-1).tolist()]}


def trajectory(t):
    """The Trajectory of a wire Trajectory table (arrays are copies: the buffer may go)."""
    ids = _vec(t, "Ids")
    lps = _vec(t, "Logprobs")
    mask = _vec(t, "Mask")
    fp = t.Fingerprint()
    return Trajectory(
        group_id=t.GroupId(), prompt_index=t.PromptIndex(), sample_index=t.SampleIndex(),
        ids=np.array([], np.int32) if ids is None else np.asarray(ids, np.int32).copy(),
        logprobs=np.array([], np.float32) if lps is None else np.asarray(lps, np.float32).copy(),
        finish=FINISH_NAMES.get(t.Finish(), "none"), turns=t.Turns(),
        versions=[(t.Versions(i).Begin(), t.Versions(i).Version())
                  for i in range(t.VersionsLength())],
        cost=cost(t.Cost()), replica=(t.Replica() or b"").decode(),
        client_tag=(t.ClientTag() or b"").decode(),
        fingerprint={} if fp is None else {"weights_hash": fp.WeightsHash(),
                                           "kernel_version": fp.KernelVersion(),
                                           "attention_chunk": fp.AttentionChunk(),
                                           "backend": (fp.Backend() or b"").decode()},
        error=None if t.Error() is None else error(t.Error()),
        mask=(np.ones(0 if ids is None else len(ids), np.uint8) if mask is None
              else np.asarray(mask, np.uint8).copy()),
        tool_calls=[tool_call(t.ToolCalls(i)) for i in range(t.ToolCallsLength())],
        routing=routing(t.Routing()))


def token_chunk(c):
    """The TokenChunk of a wire TokenChunk table."""
    ids = _vec(c, "Ids")
    lps = _vec(c, "Logprobs")
    inj = _vec(c, "InjectedIds")
    return TokenChunk(c.GroupId(), c.PromptIndex(), c.SampleIndex(), c.PositionBegin(),
                      np.asarray([] if ids is None else ids, np.int32),
                      np.asarray([] if lps is None else lps, np.float32),
                      c.WeightVersion(), None if inj is None else np.asarray(inj, np.int32))


def group_done(d):
    """The summary dict of a GroupDone table."""
    return {"trajectories": d.Trajectories(), "errors": d.Errors(), "aborted": d.Aborted(),
            "cost": cost(d.Cost())}


def status_reply(s):
    """The dict of a StatusReply table."""
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
            "waiting_for_weights": s.WaitingForWeights(),
            "wal_enabled": s.WalEnabled(), "wal_last_lsn": s.WalLastLsn(),
            "wal_committed_lsn": s.WalCommittedLsn(), "wal_durable_lsn": s.WalDurableLsn(),
            "wal_error": None if s.WalError() is None else error(s.WalError()),
            "fingerprint": None if s.Fingerprint() is None else {
                "weights_hash": s.Fingerprint().WeightsHash(),
                "kernel_version": s.Fingerprint().KernelVersion(),
                "attention_chunk": s.Fingerprint().AttentionChunk(),
                "backend": (s.Fingerprint().Backend() or b"").decode()}}
