"""A GRPO-style training step with bitroll.torch.Policy equals one with a plain PyTorch copy.

Same weights, same batch (packed trajectories of stories260K from `bitroll generate`), same
clipped-ratio loss with fixed advantages; the gradients of every parameter must agree within
a relative tolerance of 1e-4 (max |g_policy - g_plain| / max |g_plain|, per tensor): the two
forwards differ only by float32 rounding (different summation orders), the backwards are both
PyTorch math. The logprobs themselves are close (1e-4) but not bitwise equal, and the test
checks that too: the plain copy is a real second implementation, not the same code.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()
models = tc.models_dir()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bitroll.torch import Policy, pack  # noqa: E402
from bitroll.torch.reference import plain_copy  # noqa: E402

REL_TOL = 1e-4
c = tc.Checks()
model = os.path.join(models, "stories260K.bin")
recs = tc.generate(a.bitroll, model, [[1, 403, 407, 261, 378], [1, 403], [1, 261]], 4, 3, 48,
                   1.0)
seqs = [r["prompt_ids"] + r["ids"] for r in recs]
batch = pack(seqs)
score_mask = torch.zeros(batch.tokens.numel(), dtype=torch.bool)
for r, start in zip(recs, batch.cu_seqlens[:-1].tolist()):
    p = len(r["prompt_ids"])
    score_mask[start + p:start + p + len(r["ids"])] = True
old = torch.from_numpy(np.array([int(b, 16) for r in recs for b in r["logprob_bits"]],
                                np.uint32).view(np.float32))
adv = torch.tensor([(i % 4 - 1.5) for i, r in enumerate(recs) for _ in r["ids"]])


def loss_of(lp):
    ratio = torch.exp(lp[score_mask] - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()


policy = Policy.from_file(model)
plain = plain_copy(policy)
lp_pol = policy.logprobs(batch, temperature=1.0)
lp_plain = plain.logprobs(batch, temperature=1.0)
diff = (lp_pol - lp_plain)[score_mask].abs().max().item()
c.check(0 < diff < 1e-4, f"logprobs: policy vs plain PyTorch max |diff| {diff:.2e} (close, "
        "not bitwise equal)")
c.check(torch.equal(lp_pol[score_mask].view(torch.int32), old.view(torch.int32)),
        "the policy's logprobs are generate's bits (ratio exactly 1)")
loss_of(lp_pol).backward()
loss_of(lp_plain).backward()
plain_params = plain.state_named()
worst = ("", 0.0)
for name, p in policy.named_parameters():
    q = plain_params[name]
    rel = ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)).item()
    if rel > worst[1]:
        worst = (name, rel)
    if rel > REL_TOL:
        c.check(False, f"gradient of {name}: relative difference {rel:.2e} > {REL_TOL}")
n = len(list(policy.parameters()))
c.check(worst[1] <= REL_TOL, f"gradients of all {n} parameters agree: worst relative "
        f"difference {worst[1]:.2e} ({worst[0]}) <= {REL_TOL}")
c.done()
