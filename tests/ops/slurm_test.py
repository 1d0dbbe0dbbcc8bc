"""deploy/slurm/bitroll.sbatch on a real single-host Slurm cluster (issue 20, item 3).

Starts munged, slurmctld and slurmd from Debian's packages in a temporary folder
(tests/ops/slurm_cluster.py), submits the sbatch script with 2 tasks on the one node (the
coordinator with its WAL in a data directory, and one `bitroll replica` that connects to it over
TCP), reads the endpoint the script publishes, runs a client against it and checks that every
trajectory came from the Slurm replica and equals `bitroll generate` bit for bit (ids and fp32
logprob bits; a negative control with another seed must differ). Then it cancels the job and stops
every daemon, also on failure, and checks that no process is left.

Where Slurm cannot start (not installed, no permission) it says so LOUDLY and fails, unless
BITROLL_ALLOW_NO_SLURM=1, where it exits 77 (ctest: skipped).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "outside"))
sys.path.insert(0, HERE)
import outside_common as oc  # noqa: E402
from slurm_cluster import SlurmCluster, SlurmUnavailable, descendants, cmdline  # noqa: E402

SBATCH = os.path.join(oc.ROOT, "deploy", "slurm", "bitroll.sbatch")
SKIP = 77


def no_slurm(why):
    bar = "!" * 78
    print(f"{bar}\nSLURM COULD NOT START: {why}\n{bar}", flush=True)
    if os.environ.get("BITROLL_ALLOW_NO_SLURM") == "1":
        print("SKIPPED LOUDLY: BITROLL_ALLOW_NO_SLURM=1 is set")
        return SKIP
    print("FAILED: the Slurm test must run (scripts/deps.sh installs slurm-wlm and munge); set "
          "BITROLL_ALLOW_NO_SLURM=1 to skip it on a machine that cannot run Slurm")
    return 1


def wait_file(path, job, cluster, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        if cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING"):
            return None
        time.sleep(0.1)
    return None


def wait_replica(endpoint, job, cluster, timeout):
    """The service's status once a remote replica is alive; the last status (or None) if the
    job ends or the time runs out first."""
    client = oc.bitroll.Client(endpoint, timeout_ms=2000)
    deadline = time.time() + timeout
    st = None
    try:
        while time.time() < deadline and cluster.job_state(job) == "RUNNING":
            try:
                st = client.status()
            except oc.bitroll.BitrollError:
                continue
            if any(r["alive"] and r["remote"] for r in st["replicas"]):
                return st
            time.sleep(0.2)
    finally:
        client.close()
    return st


def run_job(a, cluster, tmp, failures):
    data = os.path.join(tmp, "shared", "data")
    out = os.path.join(tmp, "job.out")
    env = {"BITROLL": a.bitroll, "BITROLL_MODEL": a.model, "BITROLL_DATA_DIR": data,
           "BITROLL_PORT": str(oc.free_port()), "BITROLL_REPLICA_PORT": str(oc.free_port()),
           "BITROLL_THREADS": "1", "BITROLL_START_TIMEOUT_S": "30"}
    job = cluster.sbatch(["--ntasks=2", "--nodes=1", f"--output={out}", "--job-name=bitroll-test",
                          "--time=5", SBATCH], env)
    print(f"submitted job {job}: {SBATCH}", flush=True)
    try:
        endpoint = wait_file(os.path.join(data, "endpoint"), job, cluster, 60)
        if endpoint is None:
            failures.append(f"no endpoint file from the job (state {cluster.job_state(job)}):\n"
                            + cluster.file_tail(out))
            return job, out, data
        want = f"tcp://localhost:{env['BITROLL_PORT']}"
        if endpoint != want:
            failures.append(f"endpoint file says {endpoint}, want {want}")
        print(f"coordinator at {endpoint}", flush=True)
        st = wait_replica(endpoint, job, cluster, 30)
        client = oc.bitroll.Client(endpoint, timeout_ms=60000)
        try:
            check_service(a, client, st, tmp, failures)
        finally:
            client.close()
    finally:
        cluster.run(["scancel", job], check=False)
    return job, out, data


def check_service(a, client, st, tmp, failures):
    remote = [r for r in (st or {}).get("replicas", []) if r["alive"] and r["remote"]]
    if len(remote) != 1 or len(st["replicas"]) != 1:
        failures.append(f"want exactly one live remote replica (the Slurm task), got {st}")
        return
    if not remote[0]["name"].startswith("slurm-"):
        failures.append(f"the replica is not the sbatch script's: {remote[0]['name']}")
    refs = oc.References(a.bitroll, a.model, tmp)
    spec = {"prompts": [[1, 403, 407, 259], [1, 500, 30, 261, 300]], "n": 3, "seed": 1234,
            "max_tokens": 24, "params": {"temperature": 1.0, "top_p": 0.95}}
    group = client.submit(spec["prompts"], n=spec["n"], params=spec["params"], seed=spec["seed"],
                          max_tokens=spec["max_tokens"])
    trajs = group.result()
    if len(trajs) != 6:
        failures.append(f"want 6 trajectories, got {len(trajs)}")
    for t in trajs:
        why = refs.check(spec, t)
        if why:
            failures.append(f"prompt {t.prompt_index} sample {t.sample_index}: {why}")
        if t.replica != remote[0]["name"]:
            failures.append(f"trajectory from replica {t.replica!r}, not the Slurm replica")
    # Negative control: the comparison sees another seed's bits.
    other = dict(spec, seed=spec["seed"] + 1)
    if trajs and refs.check(other, trajs[0]) is None:
        failures.append("negative control: generate with another seed gave the same bits")
    print(f"{len(trajs)} trajectories from {remote[0]['name']} checked against "
          "bitroll generate", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    a = oc.parse_args(ap)
    if a is None:
        return 0
    a.bitroll, a.model = os.path.abspath(a.bitroll), os.path.abspath(a.model)
    t0 = time.time()
    failures = []
    with oc.TempDir("bitroll_slurm_") as tmp:
        cluster = SlurmCluster(tmp)
        out = None
        try:
            try:
                cluster.start()
            except SlurmUnavailable as e:
                return no_slurm(str(e))
            print(f"slurm up in {time.time() - t0:.1f} s", flush=True)
            job, out, data = run_job(a, cluster, tmp, failures)
            if not cluster.wait_gone(job, 30):
                failures.append(f"job {job} still {cluster.job_state(job)} 30 s after scancel")
            if os.path.exists(os.path.join(data, "endpoint")):
                failures.append("the ended job left its endpoint file")
            alive = [cmdline(p) for p in descendants()
                     if os.path.basename(cmdline(p).split(" ")[0]) == "bitroll"]
            if alive:
                failures.append(f"bitroll processes alive after the job ended: {alive}")
        except Exception as e:  # noqa: BLE001  report, then clean up
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            left = cluster.stop()
            if left:
                print(f"killed after the daemons stopped: {left}")
            still = [cmdline(p) for p in descendants()]
            if still:
                failures.append(f"processes left after stop: {still}")
            if failures:
                for name in ("slurmctld", "slurmd", "munged"):
                    print(f"---- {name}\n{cluster.log_tail(name)}")
                if out:
                    print(f"---- job output\n{cluster.file_tail(out)}")
    return oc.report("slurm_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
