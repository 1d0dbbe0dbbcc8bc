"""Streams a model's weights into a running bitroll service (UpdateWeights with tensors).

A trainer holds its weights in memory, not in a file the replicas can read: it sends them tensor
by tensor, named as the served model's format names them (docs/weights.md). Here the "trainer"
reads a llama2.c checkpoint with numpy, as llama2.c's model.py would hold it after a step.

    python3 stream_weights.py --connect tcp://127.0.0.1:5555 --model stories260K.bin --version 2
    python3 stream_weights.py --bitroll build/rollout/bitroll --self-test   # used by ctest/demo

--self-test starts `bitroll serve` on a random model of stories260K's shape, streams the real
stories260K into it, runs a GRPO group, and checks the trajectories are bit-identical (ids and
logprob bits) to those of a service started on stories260K itself; before the update they are
not. It also shows a typed error (a misnamed tensor) that installs nothing.
Runs on Debian's /usr/bin/python3 with python3-zmq, python3-flatbuffers and python3-numpy.
The bitroll package must be importable: PYTHONPATH=build/python after a build, or
installed with `pip install ./python` (README, "Python client").
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from bitroll import BitrollError, Client, model_files


def serve(bitroll, model):
    p = subprocess.Popen([bitroll, "serve", "--model", model, "--replicas", "2", "--bind", "tcp://127.0.0.1:*", "--log-level", "warn"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("bitroll serve: clients "):
        p.kill()
        raise RuntimeError(f"bitroll serve did not start: {line!r}")
    return p, line.split()[-1]


PROMPTS = ["Once upon a time", "The little dog", "Lily saw a big"]


def run_group(client, gid):
    g = client.submit(PROMPTS, n=4, params={"temperature": 1.0}, seed=7, max_tokens=48,
                      group_id=gid)
    trajs = sorted(g, key=lambda t: (t.prompt_index, t.sample_index))
    return trajs


def same_bits(a, b):
    return (len(a) == len(b) and
            all(np.array_equal(x.ids, y.ids) and
                x.logprobs.tobytes() == y.logprobs.tobytes() for x, y in zip(a, b)))


def self_test(bitroll, models):
    real = os.path.join(models, "stories260K.bin")
    tok = os.path.join(models, "tok512.bin")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([bitroll, "make-model", "--shape", "stories260k", "--out", tmp,
                        "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
        shutil.copyfile(tok, os.path.join(tmp, "tokenizer.bin"))  # the same text -> ids
        procs = []
        try:
            p, ep_ref = serve(bitroll, real)
            procs.append(p)
            p, ep = serve(bitroll, os.path.join(tmp, "model.bin"))
            procs.append(p)
            ref = run_group(Client(ep_ref), 1)
            c = Client(ep, timeout_ms=60000)
            before = run_group(c, 1)
            print(f"before the update: {sum(same_bits([a], [b]) for a, b in zip(before, ref))}"
                  f" of {len(ref)} trajectories equal the stories260K service's")
            if any(same_bits([a], [b]) for a, b in zip(before, ref)):
                print("FAIL: the negative control matches")
                return 1
            tensors = model_files.load_llama2c(real)[0]
            bad = [("layers.0.attention.wz.weight", tensors[2][1])] + tensors[3:]
            try:
                c.update_weights_tensors(bad, version=2, full=True)
                print("FAIL: a misnamed tensor was accepted")
                return 1
            except BitrollError as e:
                print(f"misnamed tensor refused ({e.code}): {e.message[:90]}...")
            if c.status()["weight_version"] != 0:
                print("FAIL: the refused update changed the live version")
                return 1
            live = c.update_weights_tensors(tensors, version=2, full=True, part_bytes=64 << 10)
            after = run_group(c, 2)
            ok = same_bits(after, ref) and all(t.versions[-1][1] == 2 for t in after)
            n_bytes = sum(a.nbytes for _, a in tensors)
            print(f"streamed {len(tensors)} tensors ({n_bytes} bytes) as version {live}: "
                  f"{sum(same_bits([a], [b]) for a, b in zip(after, ref))} of {len(ref)} "
                  "trajectories bit-identical to the stories260K service")
            return 0 if ok else 1
        finally:
            for p in procs:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connect", help="the service's client endpoint")
    ap.add_argument("--model", help="llama2.c checkpoint whose weights to stream")
    ap.add_argument("--version", type=int, default=1)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--bitroll", help="the bitroll executable (--self-test)")
    ap.add_argument("--models", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", "..", "..", "shared", "models"))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        if not a.bitroll:
            ap.error("--self-test needs --bitroll")
        return self_test(a.bitroll, os.environ.get("BITROLL_MODELS_DIR", a.models))
    if not (a.connect and a.model):
        ap.error("give --connect and --model (or --self-test)")
    c = Client(a.connect, timeout_ms=120000)
    live = c.update_weights_tensors(model_files.load_llama2c(a.model)[0], version=a.version, drain=a.drain,
                                    full=True)
    print(f"weights version {live} live on every replica")
    return 0


if __name__ == "__main__":
    sys.exit(main())
