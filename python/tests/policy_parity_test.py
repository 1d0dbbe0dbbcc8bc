"""bitroll.torch.Policy's logprobs equal `bitroll generate --json`'s logprob bits.

Trajectories of several lengths (prompts of 1..21 tokens, completions up to 120 tokens, some
stopped early by EOS) from stories260K (a real trained model), a random make-model shape (GQA)
and stories260K with an untied classifier (a llama2.c file with a negative vocab size and its
own output.weight), at temperatures 1.0, 0.8 and 0 (greedy scores at T = 1). The policy scores
them at training batch sizes 1, 3, 8 and 32, shuffled, packed and padded (right and left), on 1
and 2 threads; every completion token's logprob must equal the recorded bits (uint32 views).
Negative control: one layer's wq computed with torch.nn.functional.linear must break parity.
"""

import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()
models = tc.models_dir()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bitroll.torch as bt  # noqa: E402
from bitroll.torch import Policy, pack, pad  # noqa: E402

c = tc.Checks()


def trajectories(model, vocab, temperature, seed):
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, vocab) for _ in range(n)] for n in (0, 2, 4, 7, 11, 20)]
    out = []
    for max_tokens in (9, 40, 120):
        out += tc.generate(a.bitroll, model, prompts, 2, seed, max_tokens, temperature)
    return out


def score(policy, recs, bs, layout, temperature, threads, order):
    """Per record: the policy's logprob bits of its completion tokens."""
    bt.set_num_threads(threads)
    got = [None] * len(recs)
    for i in range(0, len(order), bs):
        idx = order[i:i + bs]
        seqs = [recs[j]["prompt_ids"] + recs[j]["ids"] for j in idx]
        with torch.no_grad():
            if layout == "packed":
                batch = pack(seqs)
                lp = policy.logprobs(batch, temperature=temperature)
                starts = batch.cu_seqlens[:-1].tolist()
                rows = [lp[s:s + len(q)] for s, q in zip(starts, seqs)]
            else:
                toks, mask = pad(seqs, left=(layout == "left-padded"))
                lp = policy.logprobs(toks, mask, temperature=temperature)
                rows = [lp[r][mask[r]] for r in range(len(seqs))]
        for j, row in zip(idx, rows):
            got[j] = tc.bits(row[len(recs[j]["prompt_ids"]):].numpy())
    bt.set_num_threads(1)
    return got


def want_bits(r):
    return np.array([int(b, 16) for b in r["logprob_bits"]], np.uint32)


def all_equal(recs, got):
    return all(np.array_equal(g, want_bits(r)) for r, g in zip(recs, got))


with tempfile.TemporaryDirectory() as tmp:
    random_model = os.path.join(tmp, "tiny")
    subprocess.run([a.bitroll, "make-model", "--shape", "tiny", "--out", random_model,
                    "--seed", "5"], check=True, capture_output=True)
    cases = [("stories260K", os.path.join(models, "stories260K.bin"))]
    cases.append(("make-model tiny", os.path.join(random_model, "model.bin")))
    # stories260K with its own classifier: vocab < 0 in the header, output.weight at the end.
    src = os.path.join(models, "stories260K.bin")
    head = np.fromfile(src, np.int32, count=7)
    untied = os.path.join(tmp, "untied.bin")
    head[5] = -head[5]
    cls = np.random.default_rng(3).standard_normal((-head[5], head[0])).astype(np.float32)
    with open(untied, "wb") as f:
        f.write(head.tobytes() + open(src, "rb").read()[28:] + (0.05 * cls).tobytes())
    cases.append(("stories260K untied", untied))
    for name, path in cases:
        policy = Policy.from_file(path)
        cfg = policy.config
        print(f"{name}: dim {cfg.dim}, layers {cfg.n_layers}, heads {cfg.n_heads}/"
              f"{cfg.n_kv_heads}, vocab {cfg.vocab_size}, tied classifier "
              f"{cfg.shared_classifier}")
        for temperature, seed in ((1.0, 11), (0.8, 12), (0.0, 13)):
            recs = trajectories(path, cfg.vocab_size, temperature, seed)
            lens = sorted({len(r["ids"]) for r in recs})
            tokens = sum(len(r["ids"]) for r in recs)
            order = list(range(len(recs)))
            random.Random(seed).shuffle(order)
            configs = [(1, "packed", 1), (3, "padded", 2), (8, "left-padded", 1),
                       (32, "packed", 2), (32, "padded", 1), (len(recs), "packed", 1)]
            if temperature == 1.0:
                configs += [(1, "padded", 2), (3, "packed", 1), (8, "packed", 2)]
            for bs, layout, threads in configs:
                got = score(policy, recs, bs, layout, temperature, threads, order)
                c.check(all_equal(recs, got),
                        f"{name} T={temperature}: {len(recs)} trajectories ({tokens} scored "
                        f"tokens, lengths {lens[0]}..{lens[-1]}), batch {bs} {layout}, "
                        f"{threads} thread(s): logprob bits equal generate's")

        # Negative control: the same model with one linear from PyTorch instead of bitroll.
        recs = trajectories(path, cfg.vocab_size, 1.0, 11)
        layer = policy.layers[min(1, cfg.n_layers - 1)].attention.wq
        saved = layer.forward
        layer.forward = lambda x: torch.nn.functional.linear(x, layer.weight)
        got = score(policy, recs, 8, "packed", 1.0, 1, list(range(len(recs))))
        layer.forward = saved
        differ = sum(int((g != want_bits(r)).sum()) for r, g in zip(recs, got))
        c.check(differ > 0, f"{name} negative control: torch.nn.functional.linear in one "
                f"layer's wq changes {differ} logprob(s) (parity broken, as it must be)")
        got = score(policy, recs, 8, "packed", 1.0, 1, list(range(len(recs))))
        c.check(all_equal(recs, got), f"{name}: parity again once the kernel is back")
c.done()
