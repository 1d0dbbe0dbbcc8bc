"""Shared by the trainer tests (python/tests/*_test.py, ctest label "trainer").

Exit code 77 (ctest SKIP_RETURN_CODE) with "skipped: needs ..." when PyTorch or the compiled
kernels module is missing; scripts/deps.sh installs both, so CI runs them.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

SKIP = 77


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: needs python3-torch (Debian's PyTorch for /usr/bin/python3)")
        sys.exit(SKIP)
    try:
        import bitroll.torch  # noqa: F401
    except ImportError as e:
        print(f"skipped: needs the bitroll_kernels_ext module (pybind11-dev): {e}")
        sys.exit(SKIP)


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitroll", required=True, help="the bitroll executable")
    return ap.parse_args()


def models_dir():
    d = os.environ.get("BITROLL_MODELS_DIR", "")
    if not os.path.isfile(os.path.join(d, "stories260K.bin")):
        print(f"skipped: needs stories260K.bin in BITROLL_MODELS_DIR ({d!r})")
        sys.exit(SKIP)
    return d


def generate(bitroll, model, prompts, n, seed, max_tokens, temperature, threads=1, extra=()):
    """`bitroll generate --json` for prompts given as id lists: [(prompt ids, ids, bits)]."""
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts:
            f.write(json.dumps({"ids": [int(x) for x in p]}) + "\n")
        path = f.name
    try:
        cmd = [bitroll, "generate", "--model", model, "--prompts", path, "-n", str(n),
               "--seed", str(seed), "--max-tokens", str(max_tokens), "--temperature",
               str(temperature), "--threads", str(threads), "--json", *extra]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def bits(a):
    """uint32 view of float32 values (for bitwise comparisons)."""
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


class Checks:
    """Counts failures; every check prints one line."""

    def __init__(self):
        self.failed = 0

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failed += 1

    def done(self):
        print("FAILED: %d check(s)" % self.failed if self.failed else "all checks passed")
        sys.exit(1 if self.failed else 0)


class Service:
    """`bitroll serve` on a free 127.0.0.1 port, its log in a temporary file; a context manager
    that kills it (SIGKILL to its process group) on exit."""

    def __init__(self, bitroll, model, replicas=2, extra=()):
        import socket
        import tempfile
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.endpoint = "tcp://127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        self.argv = [bitroll, "serve", "--model", model, "--replicas", str(replicas),
                     "--threads", "1", "--bind", self.endpoint, *extra]
        self.log = tempfile.NamedTemporaryFile(prefix="bitroll_trainer_", suffix=".log")
        self.proc = None

    def __enter__(self):
        import time
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            with open(self.log.name, "rb") as f:
                if b"bitroll serve: clients" in f.read():
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.__exit__()
        with open(self.log.name, "rb") as f:
            raise RuntimeError("bitroll serve did not start:\n" + f.read()[-2000:].decode())

    def __exit__(self, *exc):
        import signal
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
