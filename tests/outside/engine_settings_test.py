"""The engine settings of `bitroll serve` (flags and config keys shared with `generate` and
`audit`, rollout/engine_flags.h), driven from outside: the CLI and the wire, as a user would.

- Settings that never change a bit (--max-step-tokens, --max-prefill-chunk, --max-running,
  --prefix-cache off, --attention split, --isa scalar): the trajectories are bit-equal to
  `bitroll generate --json`, fingerprint backend "cpu". Two groups each: short prompts, and a
  GRPO group of 12 samples of a 120-token prompt, whose samples share 7 blocks of it; with the
  prefix cache on (`generate`, the default service) their decode attention runs as sibling
  groups that read those blocks once (kernels/cpu/attention.h), with --prefix-cache off or
  --max-running 1 every sample runs alone.
- --kv-dtype bf16 (flag, and "kv_dtype" in a --config file): fingerprint "cpu-kvbf16", bit-equal to
  `generate --kv-dtype bf16`, and different from the fp32 bits (the negative control: the setting
  really reaches the replica's engine).
- A grouped-query model at Qwen3-8B's and Llama 3 8B's ratio (make-model qwen3-gqa4-tiny: 8 query
  heads over 2 kv heads), whose decode rows run as kv units: the default service and the settings
  that change how its heads are scheduled (--attention split splits each unit, --max-running 1,
  --isa scalar) bit-equal to `generate`, for both groups (the GRPO group's sibling rows too).
- A hybrid (sliding-window) model under each --swa-cache policy: served at all (the start-up
  self-test passes), and a group run twice (the second time from the prefix cache, whose sliding
  state the policy keeps, checkpoints or rebuilds) bit-equal to `generate` both times.
- Bad values: exit 2 with the one usage-error style, nothing served.

    /usr/bin/python3 tests/outside/engine_settings_test.py --bitroll build/rollout/bitroll
Exit 0 = pass, 1 = a check failed.
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

np = oc.np

SPEC = {"prompts": [[1, 403, 407, 261, 378], [1, 56, 79]], "n": 3, "seed": 11, "max_tokens": 40,
        "params": {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}}

# A GRPO group: 12 samples of one 120-token prompt (7 whole shared blocks).
GROUP = {"prompts": [[1] + [3 + (13 * i) % 500 for i in range(119)]], "n": 12, "seed": 7,
         "max_tokens": 32, "params": {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}}

NEUTRAL = [
    ["--max-step-tokens", "7", "--max-prefill-chunk", "3"],
    ["--max-running", "1"],
    ["--prefix-cache", "off"],
    ["--attention", "split"],
    ["--isa", "scalar"],
]


# Prompts long enough to fill prefix-cache blocks (16 tokens) past a sliding window.
HYBRID = {"prompts": [[1] + [3 + (7 * i) % 400 for i in range(150)],
                      [1] + [5 + (11 * i) % 390 for i in range(90)]],
          "n": 2, "seed": 4, "max_tokens": 24,
          "params": {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_p": 0.0}}


def run_group(srv, failures, label, spec=SPEC):
    """The spec's group through the Python client; a list of trajectories (empty on failure)."""
    out = []
    with oc.bitroll.Client(srv.endpoint, timeout_ms=60000) as c:
        try:
            g = c.submit(spec["prompts"], n=spec["n"], params=spec["params"], seed=spec["seed"],
                         max_tokens=spec["max_tokens"])
            out = list(g)
        except Exception as e:  # a typed error or a timeout: a failure of this case
            failures.append(f"{label}: the group failed: {e}")
            return []
    if len(out) != len(spec["prompts"]) * spec["n"]:
        failures.append(f"{label}: {len(out)} trajectories")
    return out


def check(trajs, ref, backend, failures, label, spec=SPEC):
    for t in trajs:
        if t.fingerprint.get("backend") != backend:
            failures.append(f"{label}: fingerprint backend {t.fingerprint.get('backend')!r}, "
                            f"want {backend!r}")
        why = ref.check(spec, t)
        if why:
            failures.append(f"{label}: prompt {t.prompt_index} sample {t.sample_index}: {why}")


def serve_case(a, tmp, extra, ref, backend, failures, label, model=None, specs=(SPEC, GROUP),
               runs=1):
    """Each spec's group `runs` times through one service; the last run's trajectories of the
    first spec."""
    srv = oc.Server(a.bitroll, model or a.model, extra=extra,
                    log=os.path.join(tmp, f"{len(label)}.log"))
    first = []
    try:
        try:
            srv.start()
        except RuntimeError as e:  # refused to serve (a failed self-test, a bad flag)
            failures.append(f"{label}: {e}")
            return []
        for i, spec in enumerate(specs):
            for _ in range(runs):
                trajs = run_group(srv, failures, label, spec)
                check(trajs, ref, backend, failures, label, spec)
                if i == 0:
                    first = trajs
        if not srv.alive():
            failures.append(f"{label}: bitroll serve died:\n{srv.log_tail()}")
        return first
    finally:
        srv.kill9()


def usage_error(a, args, want, failures):
    argv = [a.bitroll, "serve", "--model", a.model, "--bind", "tcp://127.0.0.1:1"] + args
    try:
        p = subprocess.run(argv, capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:  # it started serving: the bad value was accepted
        failures.append(f"serve {' '.join(args)}: accepted (still running after 20 s)")
        return
    err = p.stderr.decode(errors="replace")
    if p.returncode != 2 or f"bitroll serve: {want}" not in err or p.stdout:
        failures.append(f"serve {' '.join(args)}: rc {p.returncode}, stderr {err[:300]!r}, "
                        f"want rc 2 and 'bitroll serve: {want}'")


def main():
    ap = oc.standard_parser(__doc__)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    failures = []
    with oc.TempDir("bitroll_engine_settings_") as tmp:
        f32 = oc.References(a.bitroll, a.model, tmp)
        bf16 = oc.References(a.bitroll, a.model, tmp, extra=["--kv-dtype", "bf16"])
        serve_case(a, tmp, [], f32, "cpu", failures, "default")
        for extra in NEUTRAL:
            serve_case(a, tmp, extra, f32, "cpu", failures, " ".join(extra))
        got = serve_case(a, tmp, ["--kv-dtype", "bf16"], bf16, "cpu-kvbf16", failures,
                         "--kv-dtype bf16")
        # Negative control: the bf16 cache's bits are not the fp32 ones (else the setting was
        # dropped on the way and the checks above prove nothing).
        if got and all(f32.check(SPEC, t) is None for t in got):
            failures.append("--kv-dtype bf16: the trajectories equal the fp32 ones")
        cfg = os.path.join(tmp, "serve.json")
        with open(cfg, "w") as f:
            json.dump({"kv_dtype": "bf16", "max_step_tokens": 5, "prefix_cache": False}, f)
        serve_case(a, tmp, ["--config", cfg], bf16, "cpu-kvbf16", failures, "config kv_dtype")
        gqa = os.path.join(tmp, "gqa")
        subprocess.run([a.bitroll, "make-model", "--shape", "qwen3-gqa4-tiny", "--out", gqa],
                       check=True, capture_output=True, timeout=120)
        gref = oc.References(a.bitroll, gqa, tmp)
        for extra in ([], ["--attention", "split"], ["--max-running", "1"], ["--isa", "scalar"]):
            serve_case(a, tmp, extra, gref, "cpu", failures,
                       "gqa4 " + (" ".join(extra) or "default"), model=gqa)
        hybrid = os.path.join(tmp, "hybrid")
        subprocess.run([a.bitroll, "make-model", "--shape", "swa-5to1-tiny", "--out", hybrid],
                       check=True, capture_output=True, timeout=120)
        href = oc.References(a.bitroll, hybrid, tmp)
        for policy in ("full", "checkpoint:32", "recompute"):
            serve_case(a, tmp, ["--swa-cache", policy], href, "cpu", failures,
                       f"hybrid --swa-cache {policy}", model=hybrid, specs=(HYBRID,), runs=2)
        usage_error(a, ["--kv-dtype", "f16"], "--kv-dtype must be f32 or bf16, got 'f16'",
                    failures)
        usage_error(a, ["--prefix-cache", "maybe"], "--prefix-cache must be on or off",
                    failures)
        usage_error(a, ["--max-step-tokens", "0"], "--max-step-tokens, --max-running and "
                    "--max-prefill-chunk must be >= 1", failures)
        usage_error(a, ["--kv-cache-mb", "-5"], "--kv-cache-mb must be in [0, 2^40]", failures)
        usage_error(a, ["--swa-cache", "checkpoint:7"], "--swa-cache", failures)
    return oc.report("engine_settings_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
