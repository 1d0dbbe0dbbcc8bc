"""The peer benchmark's model file (scripts/peer/make_gguf.py, used by scripts/bench-peer.sh to
run llama.cpp on the shape bitroll's attention suite runs), checked from outside through the
`bitroll` CLI, which loads GGUF files itself:

- a small shape written by the script loads in bitroll, passes `bitroll self-test`, and
  `bitroll generate --json` decodes it greedily with its embedded tokenizer;
- the script is deterministic: the same arguments give the same bytes (the bench's two sides can
  be rebuilt weeks later on the same file);
- the shape flags reach the file: 2 and 4 kv heads give two weights hashes, and the generated
  ids lie in the 32,000-token vocabulary;
- negative controls: the same file cut short is refused with a corruption error naming a tensor,
  and bad arguments to the script (a non-GGUF tokenizer source, heads that do not divide) exit
  non-zero with a one-line message, no traceback and no file written.

    /usr/bin/python3 tests/outside/peer_gguf_test.py --bitroll build/rollout/bitroll
Exit 0 = pass, 1 = a check failed.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402

SCRIPT = os.path.join(oc.ROOT, "scripts", "peer", "make_gguf.py")
SHAPE = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--hidden", "128",
         "--context", "512"]


def make(out, *extra, tokenizer=None):
    args = [sys.executable, SCRIPT, "--out", out, *SHAPE, *extra]
    if tokenizer:
        args += ["--tokenizer-from", tokenizer]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = oc.standard_parser(__doc__)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    tokenizer = os.path.join(os.path.dirname(a.model), "llama-2-tiny-random.gguf")
    if not os.path.exists(tokenizer):
        print(f"SKIPPED LOUDLY: {tokenizer} not found (BITROLL_MODELS_DIR)")
        return 0
    t0 = time.time()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "peer.gguf")
        p = make(model, tokenizer=tokenizer)
        if p.returncode != 0 or not os.path.exists(model):
            failures.append(f"make_gguf: rc {p.returncode}: {p.stderr[-400:]}")
            return oc.report("peer_gguf", failures, t0)

        again = os.path.join(tmp, "again.gguf")
        make(again, tokenizer=tokenizer)
        if not os.path.exists(again) or sha256(again) != sha256(model):
            failures.append("make_gguf: the same arguments gave different bytes")

        st = subprocess.run([a.bitroll, "self-test", "--model", model], capture_output=True,
                            text=True, timeout=180)
        if st.returncode != 0:
            failures.append(f"self-test: rc {st.returncode}: {(st.stdout + st.stderr)[-400:]}")

        g = subprocess.run([a.bitroll, "generate", "--model", model, "--temperature", "0",
                            "--max-tokens", "8", "--json"], capture_output=True, text=True,
                           timeout=120)
        try:
            t = json.loads(g.stdout.splitlines()[0])
            ids = t["ids"]
            if len(ids) != 8 or not all(0 <= i < 32000 for i in ids):
                failures.append(f"generate: ids {ids}")
            if len(t["logprob_bits"]) != 8:
                failures.append(f"generate: {len(t['logprob_bits'])} logprobs for 8 tokens")
        except (IndexError, KeyError, ValueError) as e:
            failures.append(f"generate: rc {g.returncode}, {e}: {(g.stdout + g.stderr)[-400:]}")

        # A grouped-query shape differs from the plain one: another weights hash.
        gqa1 = os.path.join(tmp, "mha.gguf")
        make(gqa1, "--kv-heads", "4", tokenizer=tokenizer)
        h = []
        for m in (model, gqa1):
            r = subprocess.run([a.bitroll, "generate", "--model", m, "--temperature", "0",
                                "--max-tokens", "1", "--json"], capture_output=True, text=True,
                               timeout=120)
            try:
                h.append(json.loads(r.stdout.splitlines()[0])["fingerprint"]["weights_hash"])
            except (IndexError, KeyError, ValueError):
                failures.append(f"generate {m}: rc {r.returncode}: {r.stderr[-300:]}")
        if len(h) == 2 and h[0] == h[1]:
            failures.append("2 and 4 kv heads gave the same weights hash")

        # Negative controls.
        cut = os.path.join(tmp, "cut.gguf")
        with open(model, "rb") as f, open(cut, "wb") as o:
            o.write(f.read()[: os.path.getsize(model) // 2])
        c = subprocess.run([a.bitroll, "self-test", "--model", cut], capture_output=True,
                           text=True, timeout=120)
        if c.returncode == 0 or "corruption" not in c.stderr or "tensor" not in c.stderr:
            failures.append(f"a file cut in half: rc {c.returncode}, stderr {c.stderr[-300:]!r}")

        for label, extra, tok in (("a non-GGUF tokenizer source", [], a.model),
                                  ("5 heads of a 64-wide model", ["--heads", "5"], tokenizer)):
            bad = os.path.join(tmp, "bad.gguf")
            b = make(bad, *extra, tokenizer=tok)
            if (b.returncode == 0 or "Traceback" in b.stderr or not b.stderr.strip()
                    or os.path.exists(bad) or os.path.exists(bad + ".tmp")):
                failures.append(f"make_gguf with {label}: rc {b.returncode}, "
                                f"stderr {b.stderr[-300:]!r}, file left: {os.path.exists(bad)}")
    return oc.report("peer_gguf", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
