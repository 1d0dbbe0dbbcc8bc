"""Multi-turn rollouts with a tool, against the bitroll service.

The model's text between two delimiters is a tool call; the service runs it in the sandbox,
appends the result as tokens (mask 0: the trainer does not train on them) and lets the model go
on, up to --max-turns model turns. The tiny stories model emits no tool syntax, so this example
uses delimiters it does emit: " was" opens a call and "." closes it, and the tool is the built-in
`echo` function (function tier: no root needed). With a real model use e.g. "<tool>" / "</tool>".

    PYTHONPATH=build/python /usr/bin/python3 examples/python/tool_rollout.py \
        --endpoint tcp://127.0.0.1:5555

The bitroll package must be importable: PYTHONPATH=build/python after a build, or
installed with `pip install ./python` (README, "Python client").
"""

import argparse
import sys

import numpy as np

from bitroll import Client


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    tools = [{"name": "echo", "tier": "function", "function": "echo", "wall_ms": 2000}]
    with Client(args.endpoint) as client:
        runs = []
        for _ in range(2):  # the same seeded request twice: identical bits, tool results included
            group = client.submit(["Once upon a time"], n=args.n, seed=args.seed,
                                  params={"temperature": 0.9}, max_tokens=args.max_tokens,
                                  max_turns=args.max_turns, tools=tools,
                                  tool_open=" was", tool_close=".")
            runs.append(sorted(group.result(), key=lambda t: t.sample_index))
        for t in runs[0]:
            mask = np.asarray(t.mask)
            print(f"sample {t.sample_index}: {t.turns} turns, {len(t.tool_calls)} tool calls, "
                  f"{int(mask.sum())} sampled + {int((mask == 0).sum())} injected tokens, "
                  f"finish {t.finish}, sandbox {t.cost['sandbox_seconds'] * 1e3:.2f} ms")
            for call in t.tool_calls[:2]:
                print(f"    call {call['input']!r} -> {call['output']!r}")
        same = all(np.array_equal(a.ids, b.ids) and
                   np.asarray(a.logprobs, dtype=np.float32).tobytes() ==
                   np.asarray(b.logprobs, dtype=np.float32).tobytes() and
                   np.array_equal(a.mask, b.mask)
                   for a, b in zip(*runs))
        print("the same request twice: " + ("identical ids, logprob bits and masks" if same
                                            else "MISMATCH"))
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
