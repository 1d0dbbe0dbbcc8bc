"""A single-host Slurm cluster from Debian's packages (slurm-wlm, munge), for tests.

Everything lives in one temporary folder: the munge key, socket and log, slurm.conf, the state and
spool folders and the daemons' logs. munged, slurmctld and slurmd run in the foreground as this
process's children (no systemd, no /etc/slurm, no /run/munge), on free ports. The process makes
itself a child subreaper first, so the job step daemons (slurmstepd) that slurmd double-forks, and
everything they start, stay its descendants: stop() kills and reaps every one of them, and
descendants() shows that nothing is left.

    c = SlurmCluster(tmp)
    c.start()          # raises SlurmUnavailable(reason) when Slurm cannot run here
    job = c.sbatch(["--ntasks=2", script], env)
    c.wait_state(job, {"RUNNING"})
    c.stop()           # always (also after a failure): every daemon and job process dies
"""

import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import time

from outside_common import free_port  # tests/outside, on sys.path (slurm_test.py)

PR_SET_CHILD_SUBREAPER = 36
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


class SlurmUnavailable(Exception):
    """Slurm cannot run on this machine; the message says why."""


def _children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d))
    return out


def descendants(pid=None):
    """Live (not zombie) descendants of pid (default: this process), deepest last."""
    todo, out = [pid or os.getpid()], []
    while todo:
        kids = _children_of(todo.pop())
        out += kids
        todo += kids
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class SlurmCluster:
    def __init__(self, tmp, cpus=None):
        self.dir = os.path.join(tmp, "slurm")
        self.cpus = max(2, cpus or os.cpu_count() or 2)
        self.procs = {}
        self.env = dict(os.environ)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env["SLURM_CONF"] = self.conf
        self.user = pwd.getpwuid(os.getuid()).pw_name

    # ---- start ----

    def start(self, timeout=30.0):
        missing = [d for d in DAEMONS if shutil.which(d, path=os.environ.get("PATH", "") +
                                                      ":/usr/sbin:/sbin") is None]
        if missing:
            raise SlurmUnavailable(f"not installed: {' '.join(missing)} (Debian packages "
                                   "slurm-wlm and munge; scripts/deps.sh installs them)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("not root: slurmd runs job steps as their owner and needs "
                                   "root for it (CI runs the tests as root)")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise SlurmUnavailable("prctl(PR_SET_CHILD_SUBREAPER) failed: "
                                   + os.strerror(ctypes.get_errno()))
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o700, exist_ok=True)
        self._start_munge(timeout)
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", self.conf])
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with status {p.returncode}:\n"
                                           + self.log_tail(name))
            r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.2)
        raise SlurmUnavailable("the node did not come up idle within "
                               f"{timeout:.0f} s:\n" + self.log_tail("slurmctld")
                               + self.log_tail("slurmd"))

    def _start_munge(self, timeout):
        m = os.path.join(self.dir, "munge")
        key = os.path.join(m, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = os.path.join(m, "munge.socket")
        self._spawn("munged", ["munged", "--foreground", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--log-file={os.path.join(self.dir, 'log', 'munged.log')}",
                               f"--pid-file={os.path.join(m, 'munged.pid')}",
                               f"--seed-file={os.path.join(m, 'munged.seed')}"])
        deadline = time.time() + timeout
        while not os.path.exists(self.munge_socket):
            if self.procs["munged"].poll() is not None or time.time() > deadline:
                raise SlurmUnavailable("munged did not start:\n" + self.log_tail("munged") +
                                       self.file_tail(os.path.join(self.dir, "log",
                                                                   "munged.log")))
            time.sleep(0.05)

    def _write_conf(self):
        d = self.dir
        lines = [
            "ClusterName=bitrolltest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            f"SlurmUser={self.user}",
            f"SlurmdUser={self.user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "KillWait=5",
            # The CPUs below may exceed this machine's (a 1-core runner still gets 2 tasks).
            "SlurmdParameters=config_overrides",
            f"NodeName=localhost CPUs={self.cpus} RealMemory=512 State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, name, argv):
        log = open(os.path.join(self.dir, "log", name + ".out"), "wb")
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env,
                                                start_new_session=True)
        except OSError as e:
            raise SlurmUnavailable(f"cannot run {argv[0]}: {e}")
        finally:
            log.close()

    # ---- use ----

    def run(self, argv, check=True, timeout=30, env=None):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env=env or self.env)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr}")
        return r

    def sbatch(self, args, env):
        """Submits a batch job; returns its id. env: extra variables the job gets."""
        full = dict(self.env, **env)
        r = self.run(["sbatch", "--parsable"] + list(args), env=full)
        return r.stdout.strip().split(";")[0]

    def job_state(self, job):
        """The job's state (PENDING, RUNNING, ...), or None once Slurm has forgotten it."""
        r = self.run(["scontrol", "show", "job", "-o", job], check=False)
        for word in r.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return None

    def wait_gone(self, job, timeout=30.0):
        """Waits until the job has ended (no longer pending, running or completing)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.job_state(job) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING",
                                           "SUSPENDED"):
                return True
            time.sleep(0.2)
        return False

    def file_tail(self, path, n=3000):
        try:
            with open(path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, name, n=3000):
        return (self.file_tail(os.path.join(self.dir, "log", name + ".out"), n) +
                self.file_tail(os.path.join(self.dir, "log", name + ".log"), n))

    # ---- stop ----

    def stop(self):
        """Stops slurmd, slurmctld and munged (TERM, then KILL) and then every descendant left
        (job steps, their tasks), and reaps them. Returns the command lines of the processes
        that were still alive after the daemons stopped (they are dead now too)."""
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        left = []
        for _ in range(50):
            pids = [p for p in descendants() if p not in (x.pid for x in self.procs.values())]
            if not pids:
                break
            for pid in pids:
                left.append(cmdline(pid))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.reap()
            time.sleep(0.1)
        self.reap()
        return sorted(set(left))

    @staticmethod
    def reap():
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
