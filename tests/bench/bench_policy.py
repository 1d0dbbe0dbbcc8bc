"""bitroll.torch.Policy vs a plain PyTorch copy (bitroll.torch.reference): forward (logprobs,
no grad) and forward + backward tokens/s on packed batches, at 1 and 2 threads (the kernels'
threads and torch's intra-op threads alike). Medians of --reps repetitions; ratios within one
run. Run by hand (docs/benchmarks.md):

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/bench_policy.py \
        --bitroll build/rollout/bitroll --models-dir ../shared/models
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time

import torch

import bitroll.torch as bt
from bitroll.torch import Policy, pack
from bitroll.torch.reference import plain_copy


def timed(fn, reps):
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitroll", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--models", default="stories260K,stories15m",
                    help="stories260K (the real model) and/or stories15m (random weights)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = []
        if "stories260K" in args.models:
            models.append(("stories260K", os.path.join(args.models_dir, "stories260K.bin")))
        if "stories15m" in args.models:
            s15 = os.path.join(tmp, "s15m")
            subprocess.run([args.bitroll, "make-model", "--shape", "stories15m", "--out", s15],
                           check=True, capture_output=True)
            models.append(("stories15m (random)", os.path.join(s15, "model.bin")))
        print(f"batch: {args.seqs} sequences x {args.len} tokens, packed; median of "
              f"{args.reps}; isa {bt.ops.ext.isa()}; torch {torch.__version__}", flush=True)
        print("| model | threads | pass | bitroll.torch tok/s | plain PyTorch tok/s | ratio |")
        print("|---|---|---|---|---|---|")
        for name, path in models:
            policy = Policy.from_file(path)
            plain = plain_copy(policy)
            g = torch.Generator().manual_seed(0)
            v = policy.config.vocab_size
            seqs = [torch.randint(3, v, (args.len,), generator=g).tolist()
                    for _ in range(args.seqs)]
            batch = pack(seqs)
            n = batch.tokens.numel()
            for threads in (1, 2):
                bt.set_num_threads(threads)
                torch.set_num_threads(threads)
                for label, grad in (("forward", False), ("forward+backward", True)):
                    def run(m):
                        def f():
                            m.zero_grad(set_to_none=True)
                            with torch.set_grad_enabled(grad):
                                lp = m.logprobs(batch, temperature=1.0)
                                if grad:
                                    lp.sum().backward()
                        return f
                    tp = timed(run(policy), args.reps)
                    tq = timed(run(plain), args.reps)
                    print(f"| {name} | {threads} | {label} | {n / tp:.0f} | {n / tq:.0f} | "
                          f"{tq / tp:.2f} |", flush=True)
        bt.set_num_threads(1)


if __name__ == "__main__":
    main()
