"""A trainer that broadcasts new weights to a bitroll service over NCCL (docs/weights_nccl.md).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/nccl_update_weights.py \
        --connect tcp://HOST:5555 --model FILE --version N [--perturb-seed S] [--device D] \
        [--drain] [--timeout-ms T]

The Python twin of examples/cpp/nccl_update_weights.cc: loads FILE (a llama2.c checkpoint, or a
*.safetensors file / a Hugging Face directory of them), optionally multiplies every element by
(1 + 1e-3 u) with u in [-1, 1) drawn from a generator seeded with S, uploads the tensors to GPU D,
broadcasts them to every live replica with broadcast_weights_nccl(), then runs one small rollout
group and prints the weight version its trajectories carry (exit status 0 when it is N).

The broadcast itself is the package's bitroll.nccl.broadcast_weights_nccl (NCCL and the CUDA
runtime through ctypes: no torch needed). Runs on Debian's /usr/bin/python3 with python3-zmq,
python3-flatbuffers, python3-numpy and the bitroll package (PYTHONPATH=<build>/python, or
installed with `pip install ./python`).
"""

import argparse
import os
import sys
import time

import numpy as np

from bitroll import BitrollError, Client, model_files
from bitroll.nccl import broadcast_weights_nccl


def perturb(tensors, seed):
    """Every element times (1 + 1e-3 u), u uniform in [-1, 1) from one seeded generator."""
    rng = np.random.default_rng(seed)
    out = []
    for name, t in tensors:
        bits = isinstance(t, tuple)
        a = model_files.bf16_to_f32(t[0]) if bits else np.asarray(t)
        u = rng.random(a.shape, dtype=np.float32) * 2 - 1
        p = (a.astype(np.float32) * (1 + np.float32(1e-3) * u)).astype(a.dtype)
        out.append((name, (model_files.f32_to_bf16(p), "bf16") if bits else p))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connect", default="tcp://127.0.0.1:5555")
    ap.add_argument("--model", required=True)
    ap.add_argument("--version", type=int, required=True)
    ap.add_argument("--perturb-seed", type=int)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--timeout-ms", type=int, default=120000)
    a = ap.parse_args()
    try:
        if a.model.endswith(".safetensors") or os.path.isdir(a.model):
            tensors, vocab = model_files.load_safetensors(a.model), None
        else:
            tensors, vocab = model_files.load_llama2c(a.model)
        if a.perturb_seed is not None:
            tensors = perturb(tensors, a.perturb_seed)
        nbytes = sum((t[0] if isinstance(t, tuple) else t).nbytes for _, t in tensors)
        print(f"model {a.model}: {len(tensors)} tensors, {nbytes / 1e6:.1f} MB, "
              + (f"perturbed with seed {a.perturb_seed}" if a.perturb_seed is not None
                 else "as loaded"))
        with Client(a.connect, timeout_ms=a.timeout_ms) as client:
            t0 = time.monotonic()
            live = broadcast_weights_nccl(client, tensors, a.version, a.device, a.drain,
                                          a.timeout_ms)
            dt = time.monotonic() - t0
            print(f"weights version {live} live after {dt:.3f} s "
                  f"({nbytes / 1e6 / dt:.1f} MB/s to every replica)")
            prompt = [1] + [i for i in range(3, 6) if vocab is None or i < vocab]
            group = client.submit([prompt], n=2, seed=7, max_tokens=8)
            ok = True
            for t in group.result():
                vs = " ".join(f"{v}@{b}" for b, v in t.versions)
                print(f"sample {t.sample_index}: {len(t.ids)} tokens, replica {t.replica}, "
                      f"weights_hash {t.fingerprint.get('weights_hash', 0):016x}, versions: {vs}")
                ok = ok and all(v == a.version for _, v in t.versions)
            print(f"{'OK' if ok else 'MISMATCH'}: rollouts "
                  f"{'carry' if ok else 'do not all carry'} weight version {a.version}")
            return 0 if ok else 1
    except BitrollError as e:
        print(f"nccl_update_weights: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
