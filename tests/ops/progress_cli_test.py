"""The progress line of long CLI work (issue 20, item 4), from outside: `bitroll generate
--prompts FILE` and `bitroll update-weights --stream FILE` draw done/total, rate and ETA on stderr
when stderr is a terminal (a pseudo-terminal here) and write no progress at all into a pipe.
"""

import argparse
import json
import os
import pty
import select
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "outside"))
import outside_common as oc  # noqa: E402

PROMPTS = 24


def run_tty(argv, timeout=120):
    """Runs argv with stderr on a pseudo-terminal (stdout to a file); returns (rc, stdout, what
    the terminal got)."""
    master, slave = pty.openpty()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, stdout=out, stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        got = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([master], [], [], 0.1)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and p.poll() is not None:
                    break
                got += chunk
            elif p.poll() is not None:
                break
        if p.poll() is None:
            p.kill()
        rc = p.wait()
        os.close(master)
        out.seek(0)
        return rc, out.read().decode(errors="replace"), got.decode(errors="replace")


def run_pipe(argv, timeout=120):
    r = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def check_generate(a, tmp, failures):
    path = os.path.join(tmp, "prompts.jsonl")
    with open(path, "w") as f:
        for i in range(PROMPTS):
            f.write(json.dumps({"ids": [1, 100 + i, 200 + i]}) + "\n")
    argv = [a.bitroll, "generate", "--model", a.model, "--prompts", path, "--json",
            "--max-tokens", "12", "--seed", "7"]
    want = f"bitroll generate: {PROMPTS}/{PROMPTS} trajectories (100%)"
    rc, out, err = run_pipe(argv)
    if rc != 0:
        failures.append(f"generate into a pipe: exit {rc}: {err}")
    if "\r" in err or "trajectories (" in err or "ETA" in err:
        failures.append(f"generate drew progress into a pipe: {err!r}")
    if len(out.splitlines()) != PROMPTS:
        failures.append(f"generate into a pipe: {len(out.splitlines())} lines, want {PROMPTS}")
    rc, out_tty, tty = run_tty(argv)
    if rc != 0:
        failures.append(f"generate on a terminal: exit {rc}: {tty}")
    if want not in tty or "\r" not in tty or "ETA" not in tty:
        failures.append(f"generate on a terminal: no progress line {want!r} in {tty!r}")
    def bits(text):  # what must not change (engine_seconds in the cost does)
        return [(j["ids"], j["logprob_bits"]) for j in map(json.loads, text.splitlines())]
    if bits(out_tty) != bits(out):
        failures.append("generate's trajectories differ when stderr is a terminal")
    print(f"generate: pipe stderr {len(err)} bytes without progress; terminal got "
          f"{tty.count(chr(13))} redraws", flush=True)


def check_update_weights(a, tmp, failures):
    server = oc.Server(a.bitroll, a.model, log=os.path.join(tmp, "serve.log")).start()
    try:
        def argv(version):
            return [a.bitroll, "update-weights", "--connect", server.endpoint, "--version",
                    str(version), "--stream", a.model, "--part-kib", "32"]
        rc, out, err = run_pipe(argv(1))
        if rc != 0:
            failures.append(f"update-weights into a pipe: exit {rc}: {err}")
        if "\r" in err or "MB (" in err or "ETA" in err:
            failures.append(f"update-weights drew progress into a pipe: {err!r}")
        rc, out, tty = run_tty(argv(2))
        if rc != 0:
            failures.append(f"update-weights on a terminal: exit {rc}: {tty}")
        if "bitroll update-weights: " not in tty or "MB (100%)" not in tty or "\r" not in tty:
            failures.append(f"update-weights on a terminal: no progress line in {tty!r}")
        if "weights version 2 live" not in out:
            failures.append(f"update-weights on a terminal: stdout {out!r}")
        print(f"update-weights: terminal got {tty.count(chr(13))} redraws", flush=True)
    finally:
        server.kill9()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    failures = []
    with oc.TempDir("bitroll_progress_") as tmp:
        check_generate(a, tmp, failures)
        check_update_weights(a, tmp, failures)
    return oc.report("progress_cli_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
