"""bitroll.torch.Policy against the running service (`bitroll serve`, 2 replicas).

1. Multi-turn rollouts with a tool: the service injects tool results (mask 0, logprob 0) between
   model turns. The policy scores prompt + completion in one packed batch; every sampled token's
   logprob equals the service's bits, and the injected tokens are exactly the mask-0 positions.
2. Weight streaming: one optimizer step on the policy, Client.update_weights_tensors(
   policy.weights()) installs it, and the next rollouts' bits equal the updated policy's
   (negative control: they differ from the old policy's, so the weights did change).
"""

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()
models = tc.models_dir()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bitroll import Client  # noqa: E402
from bitroll.torch import Policy, pack  # noqa: E402

c = tc.Checks()
model = os.path.join(models, "stories260K.bin")
PROMPTS = [[1, 403, 407, 261, 378], [1, 403], [1, 261, 378, 432, 383, 286, 261]]


def score(policy, prompts, trajs, temperature):
    """Per trajectory: (policy bits of its completion tokens)."""
    seqs = [prompts[t.prompt_index] + t.ids.tolist() for t in trajs]
    batch = pack(seqs)
    with torch.no_grad():
        lp = policy.logprobs(batch, temperature=temperature)
    out = []
    for t, s, start in zip(trajs, seqs, batch.cu_seqlens[:-1].tolist()):
        p = len(prompts[t.prompt_index])
        out.append(tc.bits(lp[start + p:start + len(s)].numpy()))
    return out


def sampled_equal(trajs, got):
    """Bits equal at every sampled (mask 1) token."""
    return all(np.array_equal(g[t.mask == 1], tc.bits(t.logprobs)[t.mask == 1])
               for t, g in zip(trajs, got))


policy = Policy.from_file(model)
with tc.Service(a.bitroll, model) as svc, Client(svc.endpoint) as client:
    # 1. multi-turn, tool tokens masked
    tools = [{"name": "echo", "tier": "function", "function": "echo", "wall_ms": 2000}]
    group = client.submit(PROMPTS, n=4, seed=7, params={"temperature": 0.9}, max_tokens=80,
                          max_turns=3, tools=tools, tool_open=" was", tool_close=".")
    trajs = group.result()
    injected = sum(int((t.mask == 0).sum()) for t in trajs)
    multi = sum(1 for t in trajs if t.turns > 1)
    c.check(injected > 0 and multi > 0,
            f"tool rollouts: {len(trajs)} trajectories, {multi} multi-turn, {injected} injected "
            "tool tokens (mask 0)")
    c.check(all(np.all(tc.bits(t.logprobs)[t.mask == 0] == 0) for t in trajs),
            "injected tokens carry logprob 0 in the service's trajectories")
    got = score(policy, PROMPTS, trajs, 0.9)
    c.check(sampled_equal(trajs, got),
            f"multi-turn: the policy's logprobs equal the service's bits at all "
            f"{sum(int(t.mask.sum()) for t in trajs)} sampled tokens")
    with torch.no_grad():
        per = policy.completion_logprobs([PROMPTS[t.prompt_index] for t in trajs],
                                         [t.ids for t in trajs], [t.mask for t in trajs], 0.9)
    c.check(all(np.array_equal(tc.bits(p.numpy()), tc.bits(t.logprobs))
                for p, t in zip(per, trajs)),
            "completion_logprobs(prompts, ids, masks) == Trajectory.logprobs, whole arrays "
            "(injected zeros included), bit for bit")

    # 2. one training step, streamed to the service
    old = copy.deepcopy(policy)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    seqs = [PROMPTS[t.prompt_index] + t.ids.tolist() for t in trajs]
    lp = policy.logprobs(pack(seqs), temperature=0.9)
    loss = -lp.sum() / len(seqs)
    loss.backward()
    opt.step()
    live = client.update_weights_tensors(policy.weights(), version=2, full=True)
    c.check(live == 2, f"update_weights_tensors(policy.weights()) installed version {live}")
    trajs2 = client.submit(PROMPTS, n=4, seed=8, params={"temperature": 1.0},
                           max_tokens=60).result()
    c.check(all(t.versions and all(v == 2 for _, v in t.versions) for t in trajs2),
            "new rollouts ran on version 2")
    c.check(sampled_equal(trajs2, score(policy, PROMPTS, trajs2, 1.0)),
            f"after a training step: {len(trajs2)} new rollouts' bits equal the updated policy's")
    c.check(not sampled_equal(trajs2, score(old, PROMPTS, trajs2, 1.0)),
            "negative control: they differ from the policy before the step")
c.done()
