"""examples/python/grpo_train.py end to end, uninterrupted and with the service killed (SIGKILL)
mid-rollout at step 3 of 6 (--data-dir, --kill-at): both runs must report max |rollout - trainer
logprob| = 0 at every step's first minibatch, and the killed run's rewards and weights digests
must equal the uninterrupted run's at every step."""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_common as tc  # noqa: E402

a = tc.args()
tc.require_torch()
models = tc.models_dir()

c = tc.Checks()
example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                       "python", "grpo_train.py")
base = [sys.executable, example, "--bitroll", a.bitroll, "--model",
        os.path.join(models, "stories260K.bin"), "--steps", "6"]
with tempfile.TemporaryDirectory() as tmp:
    logs = {}
    for name, extra in (("uninterrupted", []),
                        ("killed", ["--data-dir", os.path.join(tmp, "wal"), "--kill-at", "3"])):
        path = os.path.join(tmp, name + ".jsonl")
        r = subprocess.run(base + extra + ["--log-json", path], capture_output=True, text=True)
        print(r.stdout[-1500:] + r.stderr[-1500:])
        c.check(r.returncode == 0, f"{name} run: exit {r.returncode}")
        if name == "killed":
            c.check("killed the service (SIGKILL)" in r.stdout and "re-attaching" in r.stdout,
                    "killed run: the service was killed mid-rollout and the loop re-attached")
        logs[name] = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
        c.check(len(logs[name]) == 6 and
                all(x["max_abs_diff_first_minibatch"] == 0 for x in logs[name]),
                f"{name} run: 6 steps, max |rollout - trainer| = 0 at each first minibatch")
    u, k = logs["uninterrupted"], logs["killed"]
    c.check(len(u) == len(k) and all(x["reward"] == y["reward"] and x["weights"] == y["weights"]
                                     for x, y in zip(u, k)),
            "killed run: rewards and weights digests equal the uninterrupted run's at every step")
    c.check(len({x["weights"] for x in u}) > 2, "the weights did change over the run")
c.done()
