"""A toy GRPO-style loop against the bitroll service.

Each iteration submits groups (one prompt x n samples each), scores every trajectory with a
simple reward, and prints per-group statistics: mean and std of the reward and the group-relative
advantages (r - mean) / (std + eps) that GRPO trains on. The old log-probs the trainer would use
are the trajectories' own fp32 logprobs, bit-exact.

    /usr/bin/python3 examples/python/grpo_loop.py --endpoint tcp://127.0.0.1:5555
    # or let it start a NullEngine service for a dry run:
    /usr/bin/python3 examples/python/grpo_loop.py --spawn build/rollout/bitroll --iterations 2
"""

import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bitroll_client as bc  # noqa: E402


STARTERS = ["Once upon a time", "Lily wanted a dog", "Tom found a big red ball",
            "The sun was shining", "One day, a little bird", "Sam and his mom went to"]


def reward(traj):
    """Toy reward: lexical diversity (distinct tokens / tokens), plus a bonus for ending on its own
    (EOS/stop). A real loop would score the decoded answer with a grader."""
    ids = list(traj.ids)
    diversity = len(set(ids)) / max(1, len(ids))
    return diversity + (0.5 if traj.finish in ("eos", "stop") else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    ap.add_argument("--spawn", help="path of the bitroll binary: start `serve --engine null`")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--text", action="store_true",
                    help="use story-starter text prompts (tokenized by the service) instead of "
                         "random token ids")
    ap.add_argument("--dump", help="append every trajectory as JSON Lines (for `bitroll cost`)")
    args = ap.parse_args()

    proc = None
    endpoint = args.endpoint
    if args.spawn:
        proc = subprocess.Popen([args.spawn, "serve", "--engine", "null", "--replicas", "2",
                                 "--bind", "tcp://127.0.0.1:*", "--log-level", "warn"],
                                stdout=subprocess.PIPE, text=True)
        endpoint = proc.stdout.readline().split()[-1]
    try:
        client = bc.Client(endpoint)
        rng = np.random.default_rng(0)
        for it in range(args.iterations):
            groups = []
            for g in range(args.groups):
                if args.text:
                    prompt = STARTERS[(it * args.groups + g) % len(STARTERS)]
                else:
                    prompt = [int(x) for x in rng.integers(3, 500, size=8)]
                groups.append(client.submit([prompt], n=args.n, seed=1000 * it + g,
                                            params={"temperature": args.temperature,
                                                    "top_p": args.top_p},
                                            max_tokens=args.max_tokens))
            print(f"iteration {it}")
            print(f"  {'group':>5} {'mean':>8} {'std':>7} {'min adv':>8} {'max adv':>8} "
                  f"{'tokens':>7} {'engine s':>9} {'$':>9}")
            for g in groups:
                trajs = g.result()
                r = np.array([reward(t) for t in trajs])
                adv = (r - r.mean()) / (r.std() + 1e-6)
                cost = g.summary["cost"]
                print(f"  {g.group_id:>5} {r.mean():8.3f} {r.std():7.3f} {adv.min():8.3f} "
                      f"{adv.max():8.3f} {cost['decode_tokens']:7d} "
                      f"{cost['engine_seconds']:9.5f} {cost['price_usd']:9.6f}")
                if args.dump:
                    with open(args.dump, "a") as f:
                        f.writelines(t.to_json() + "\n" for t in trajs)
                client.ack(g.group_id, [(t.prompt_index, t.sample_index) for t in trajs])
            st = client.status()
            print(f"  service: {st['trajectories_done']} trajectories, "
                  f"{st['tokens_per_s']:.0f} tok/s, cache hit rate {st['cache_hit_rate']:.2f}")
        client.close()
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
