"""GRPO on CPU against the bitroll service, with the trainer's forward = the rollout's forward.

Each step: rollouts for several prompts x n samples from `bitroll serve`; a reward per story;
group-relative advantages (reward - group mean) / (group std + 1e-4); PPO-clip minibatch steps
with bitroll.torch.Policy; the new weights streamed to the service (update_weights_tensors). The
policy's logprobs at the first minibatch of each step are the rollout's bits exactly (the
importance ratio is exactly 1 on-policy), and the log says so: max |rollout - trainer| = 0.

Reward: stories260K tells short stories; the reward is how often the story says " happy"
(min(count, 3) / 3 for the token " happy"), so the policy learns to write happier stories.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/grpo_train.py \
        --bitroll build/rollout/bitroll --model ../shared/models/stories260K.bin \
        --steps 30 --plot docs/img/grpo_reward.png

--bitroll tokenizes the prompts and starts its own `bitroll serve` (killed at exit); with
--endpoint the loop uses a running service of the same model instead.
--data-dir gives the service a write-ahead log; with it, --kill-at STEP kills the service
(SIGKILL) in the middle of that step's rollouts, restarts it on the same directory, and the loop
re-attaches its group (same client_id and group id) and goes on: the run's rewards and weights
equal an uninterrupted run's (the log prints a weights digest every step to compare).
"""

import argparse
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from bitroll import Client
from bitroll.errors import BitrollError
from bitroll.torch import Policy, pack, set_num_threads

PROMPTS = ["Once upon a time", "One day", "Tom and Lily", "The little girl"]
WORD = " happy"


class Service:
    """`bitroll serve` on a free local port (or a given one, for restarts)."""

    def __init__(self, bitroll, model, data_dir, port=None):
        if port is None:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.argv = [bitroll, "serve", "--model", model, "--replicas", "1", "--threads", "1",
                     "--bind", self.endpoint]
        if data_dir:
            self.argv += ["--data-dir", data_dir, "--durability", "sync"]
        self.log = tempfile.NamedTemporaryFile(prefix="grpo_serve_", suffix=".log")
        self.proc = None

    def start(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            begin = os.path.getsize(self.log.name)
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            while time.time() < deadline and self.proc.poll() is None:
                with open(self.log.name, "rb") as f:
                    f.seek(begin)
                    if b"bitroll serve: clients" in f.read():
                        return self
                time.sleep(0.02)
            time.sleep(0.2)  # e.g. the killed service's port is not free yet
        raise RuntimeError("bitroll serve did not start; see " + self.log.name)

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def tokenize(bitroll, model, texts):
    """Prompt ids as the service tokenizes them (`bitroll generate --json`'s prompt_ids)."""
    out = []
    for t in texts:
        r = subprocess.run([bitroll, "generate", "--model", model, "--prompt", t,
                            "--max-tokens", "1", "--json"], check=True, capture_output=True,
                           text=True)
        out.append(json.loads(r.stdout.splitlines()[0])["prompt_ids"])
    return out


def digest(policy):
    h = hashlib.sha256()
    for name, a in policy.weights():
        h.update(name.encode() + a.tobytes())
    return h.hexdigest()[:16]


def rollouts(state, args, step, prompt_ids):
    """The step's trajectories; re-attaches (same client_id, same group id) after a failure."""
    gid = 1000 + step
    for attempt in range(20):
        try:
            if args.kill_at == step and attempt == 0 and state["service"] is not None:
                # Kill the service once this group is running: its WAL has part of the tokens.
                group = state["client"].submit(prompt_ids, n=args.n, seed=step, group_id=gid,
                                               params={"temperature": args.temperature},
                                               max_tokens=args.max_tokens)
                it = iter(group)
                next(it)
                state["service"].kill9()
                print(f"step {step}: killed the service (SIGKILL) mid-rollout", flush=True)
                raise BitrollError("unavailable", "killed")
            group = state["client"].submit(prompt_ids, n=args.n, seed=step, group_id=gid,
                                           params={"temperature": args.temperature},
                                           max_tokens=args.max_tokens)
            trajs = group.result()
            state["client"].ack(gid, [(t.prompt_index, t.sample_index) for t in trajs])
            if args.data_dir:
                # The Ack is in the WAL before the step trains: a later crash never re-delivers
                # this group (where the trainer checkpoints, it would checkpoint after this).
                state["client"].wait_committed()
            return trajs
        except (BitrollError, TimeoutError) as e:
            if state["service"] is None:
                raise
            print(f"step {step}: service lost ({e}); restarting and re-attaching", flush=True)
            state["client"].close()
            state["service"].kill9()
            state["service"].start()
            state["client"] = Client(state["service"].endpoint, client_id=state["client_id"],
                                     timeout_ms=60000)
            # The service restarts on the weights it was started with: reinstall ours.
            state["client"].update_weights_tensors(state["policy"].weights(),
                                                   version=state["version"], full=True)
    raise RuntimeError("could not get rollouts")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitroll", required=True, help="the bitroll executable")
    ap.add_argument("--endpoint", help="use a running service instead")
    ap.add_argument("--model", required=True, help="the served llama2.c checkpoint")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads (never a bit)")
    ap.add_argument("--data-dir", help="the service's write-ahead log (with --bitroll)")
    ap.add_argument("--kill-at", type=int, default=-1, help="SIGKILL the service at this step")
    ap.add_argument("--plot", help="write reward over steps here (PNG)")
    ap.add_argument("--log-json", help="write the per-step log here (JSON Lines)")
    args = ap.parse_args()
    if args.kill_at >= 0 and (args.endpoint or not args.data_dir):
        ap.error("--kill-at needs --data-dir (and a service of its own: no --endpoint)")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    set_num_threads(args.threads)

    policy = Policy.from_file(args.model)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    prompt_ids = tokenize(args.bitroll, args.model, PROMPTS)
    word = tokenize(args.bitroll, args.model, [WORD.strip()])[0][-1]  # " happy": one token
    state = {"policy": policy, "version": 1, "client_id": "grpo-example", "service": None}
    if args.endpoint:
        endpoint = args.endpoint
    else:
        state["service"] = Service(args.bitroll, args.model, args.data_dir).start()
        endpoint = state["service"].endpoint
    state["client"] = Client(endpoint, client_id=state["client_id"], timeout_ms=60000)
    state["client"].update_weights_tensors(policy.weights(), version=1, full=True)
    log = []
    try:
        for step in range(args.steps):
            t0 = time.time()
            trajs = rollouts(state, args, step, prompt_ids)
            t_roll = time.time() - t0
            rewards = np.array([min(int(np.sum(t.ids == word)), 3) / 3 for t in trajs])
            adv = np.zeros(len(trajs))
            for p in range(len(prompt_ids)):
                idx = [i for i, t in enumerate(trajs) if t.prompt_index == p]
                r = rewards[idx]
                adv[idx] = (r - r.mean()) / (r.std() + 1e-4)
            t1 = time.time()
            order = np.random.default_rng(step).permutation(len(trajs))
            first_diff, max_ratio_dev, kls, n_tok = None, 0.0, [], 0
            for mb in np.array_split(order, args.minibatches):
                sel = [trajs[i] for i in mb]
                seqs = [prompt_ids[t.prompt_index] + t.ids.tolist() for t in sel]
                batch = pack(seqs)
                lp = policy.logprobs(batch, temperature=args.temperature)
                pos = torch.cat([torch.arange(s + len(prompt_ids[t.prompt_index]),
                                              s + len(seq))
                                 for t, s, seq in zip(sel, batch.cu_seqlens[:-1].tolist(), seqs)])
                new = lp[pos]
                old = torch.from_numpy(np.concatenate([t.logprobs for t in sel]))
                mask = torch.from_numpy(np.concatenate([t.mask for t in sel])).bool()
                a = torch.from_numpy(np.concatenate([np.full(len(t.ids), adv[i])
                                                     for i, t in zip(mb, sel)])).float()
                if first_diff is None:
                    first_diff = (new.detach() - old)[mask].abs().max().item()
                logr = new - old
                ratio = torch.exp(logr)
                loss = -torch.min(ratio * a, torch.clamp(ratio, 1 - args.clip,
                                                         1 + args.clip) * a)[mask].mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    max_ratio_dev = max(max_ratio_dev, (ratio[mask] - 1).abs().max().item())
                    kls.append(((ratio - 1) - logr)[mask].mean().item())  # k3 estimate
                n_tok += int(batch.tokens.numel())
            t_train = time.time() - t1
            state["version"] = step + 2
            state["client"].update_weights_tensors(policy.weights(), version=state["version"],
                                                   full=True)
            gen_tokens = sum(len(t.ids) for t in trajs)
            rec = {"step": step, "reward": float(rewards.mean()),
                   "max_abs_diff_first_minibatch": first_diff,
                   "max_abs_ratio_minus_1": max_ratio_dev, "kl": float(np.mean(kls)),
                   "rollout_tok_s": gen_tokens / t_roll, "train_tok_s": n_tok / t_train,
                   "weights": digest(policy)}
            log.append(rec)
            print(f"step {step:3d}  reward {rec['reward']:.3f}  max|rollout-trainer| "
                  f"{first_diff:.1e}  max|ratio-1| {max_ratio_dev:.2e}  KL {rec['kl']:.2e}  "
                  f"rollout {rec['rollout_tok_s']:7.0f} tok/s  train {rec['train_tok_s']:6.0f} "
                  f"tok/s  weights {rec['weights']}", flush=True)
    finally:
        state["client"].close()
        if state["service"] is not None:
            state["service"].kill9()
    if args.log_json:
        with open(args.log_json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in log)
    zero = all(r["max_abs_diff_first_minibatch"] == 0 for r in log)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        steps = [r["step"] for r in log]
        rew = [r["reward"] for r in log]
        k = 5
        smooth = [float(np.mean(rew[max(0, i - k + 1):i + 1])) for i in range(len(rew))]
        fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
        ax.plot(steps, rew, ".", alpha=0.5,
                label=f"mean reward of the step's {len(PROMPTS) * args.n} stories")
        ax.plot(steps, smooth, "-", label=f"moving mean ({k} steps)")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(f"reward (\"{WORD.strip()}\" count, capped)")
        ax.set_title("GRPO with bitroll (CPU); max|rollout-trainer| " +
                     ("= 0 at every step" if zero else "NOT 0"))
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot)
    print(f"max |rollout - trainer logprob| at each step's first minibatch: "
          f"{'0 at every step' if zero else 'NOT 0'}; reward {log[0]['reward']:.3f} -> "
          f"{np.mean([r['reward'] for r in log[-5:]]):.3f} (mean of the last 5 steps)")
    return 0 if zero else 1


if __name__ == "__main__":
    sys.exit(main())
