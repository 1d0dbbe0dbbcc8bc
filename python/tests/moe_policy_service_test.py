"""Policy.from_pretrained on a MoE model against the running service (`bitroll serve`).

make-model's qwen3-moe-tiny, 2 replicas, rollouts with return_routing:
1. completion_logprobs(..., routes=[t.routing ...], return_routes=True) equals every
   Trajectory.logprobs bit for bit, and the policy's own routes equal Trajectory.routing
   (uint8 ids, float32 weights: the wire's record).
2. One Adam step through the forced routes (replay_weights="router", so the router trains too),
   Client.update_weights_tensors(policy.weights()) installs every tensor, experts included; the
   next rollouts' logprobs and routes equal the updated policy's (negative control: the logprobs
   differ from the policy before the step).
"""

import copy
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bitroll import Client  # noqa: E402
from bitroll.torch import Policy, routes_equal  # noqa: E402

c = tc.Checks()
PROMPTS = [[1, 40, 41, 42, 43], [1, 300], [1, 7, 8, 9, 10, 11, 12, 13]]


def score(policy, trajs, temperature, **kw):
    """(per trajectory completion logprob bits, own routes), routes forced from the records."""
    with torch.no_grad():
        lps, own = policy.completion_logprobs(
            [PROMPTS[t.prompt_index] for t in trajs], [t.ids for t in trajs],
            temperature=temperature, routes=[t.routing for t in trajs], return_routes=True, **kw)
    return [tc.bits(p.numpy()) for p in lps], own


def equal(trajs, got):
    return all(np.array_equal(g, tc.bits(t.logprobs)) for t, g in zip(trajs, got))


with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "moe")
    subprocess.run([a.bitroll, "make-model", "--shape", "qwen3-moe-tiny", "--out", model,
                    "--seed", "9"], check=True, capture_output=True)
    policy = Policy.from_pretrained(model)
    with tc.Service(a.bitroll, model) as svc, Client(svc.endpoint) as client:
        trajs = client.submit(PROMPTS, n=4, seed=7, params={"temperature": 0.9}, max_tokens=40,
                              return_routing=True).result()
        c.check(all(t.routing is not None for t in trajs),
                f"{len(trajs)} rollouts carry routing records")
        got, own = score(policy, trajs, 0.9)
        c.check(equal(trajs, got), f"completion_logprobs with the records forced == "
                f"Trajectory.logprobs, bit for bit ({sum(len(t.ids) for t in trajs)} tokens)")
        c.check(all(routes_equal(o, t.routing) for o, t in zip(own, trajs)),
                "the policy's own routes == Trajectory.routing (ids, weight bits)")

        old = copy.deepcopy(policy)
        opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
        lps = policy.completion_logprobs([PROMPTS[t.prompt_index] for t in trajs],
                                         [t.ids for t in trajs], temperature=0.9,
                                         routes=[t.routing for t in trajs],
                                         replay_weights="router")
        loss = -sum(p.sum() for p in lps) / len(lps)
        loss.backward()
        router_grad = float(policy.model.layers[0].mlp.gate.weight.grad.abs().sum())
        opt.step()
        c.check(router_grad > 0, f"the router got a gradient through the replayed routes "
                f"({router_grad:.3g})")
        live = client.update_weights_tensors(policy.weights(), version=2, full=True)
        c.check(live == 2, f"update_weights_tensors(policy.weights()) installed version {live} "
                f"({len(policy.weights())} tensors, experts included)")
        trajs2 = client.submit(PROMPTS, n=4, seed=8, params={"temperature": 1.0},
                               max_tokens=40, return_routing=True).result()
        got, own = score(policy, trajs2, 1.0)
        c.check(equal(trajs2, got), f"after the step: {len(trajs2)} new rollouts' bits equal "
                "the updated policy's")
        c.check(all(routes_equal(o, t.routing) for o, t in zip(own, trajs2)),
                "after the step: the updated policy's routes == the new records")
        c.check(not equal(trajs2, score(old, trajs2, 1.0)[0]),
                "negative control: they differ from the policy before the step")
c.done()
