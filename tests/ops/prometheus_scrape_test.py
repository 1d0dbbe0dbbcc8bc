"""A real Prometheus scrapes `bitroll serve --metrics-bind` (issue 20, item 1).

1. starts `bitroll serve` on stories260K with a data directory (the WAL) and
   --metrics-bind 127.0.0.1:PORT;
2. starts Debian's `prometheus` with a scrape config pointing at it (scrape_interval 1s);
3. drives a few groups through the wire protocol (examples/python/bitroll_client.py) and counts
   the tokens the client received;
4. asks Prometheus's HTTP API (/api/v1/query) until its last scrape shows
   bitroll_tokens_generated_total moved by exactly those tokens, and checks the WAL commit latency
   histogram (bitroll_wal_commit_seconds_count > 0), the KV capacity gauge and `up`;
5. /health answers 200 "ready".

Prometheus is a test dependency that scripts/deps.sh installs: without it the test FAILS, loudly.

    /usr/bin/python3 tests/ops/prometheus_scrape_test.py --bitroll build/rollout/bitroll
Exit 0 = pass, 1 = a check failed.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "outside"))
import outside_common as oc  # noqa: E402


def http_get(url, timeout=5.0):
    """(status, body text); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class Prometheus:
    def __init__(self, exe, target, tmp):
        self.port = oc.free_port()
        self.config = os.path.join(tmp, "prometheus.yml")
        self.log = os.path.join(tmp, "prometheus.log")
        with open(self.config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: bitroll\n"
                    f"    static_configs:\n      - targets: ['{target}']\n")
        self.argv = [exe, f"--config.file={self.config}",
                     f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                     f"--web.listen-address=127.0.0.1:{self.port}"]
        self.proc = None

    def start(self, timeout=60.0):
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited rc={self.proc.returncode}:\n{self.tail()}")
            if http_get(f"http://127.0.0.1:{self.port}/-/ready", 1.0)[0] == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {timeout} s:\n{self.tail()}")

    def query(self, expr):
        """The instant vector of `expr`: [(labels, float value)]."""
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        code, body = http_get(url)
        if code != 200:
            return []
        d = json.loads(body)
        if d.get("status") != "success":
            return []
        return [(r["metric"], float(r["value"][1])) for r in d["data"]["result"]]

    def value(self, expr):
        """The single value of `expr`, or None."""
        r = self.query(expr)
        return r[0][1] if len(r) == 1 else None

    def wait(self, expr, pred, timeout=30.0):
        """Polls until pred(value(expr)) holds; returns the last value."""
        deadline = time.time() + timeout
        v = None
        while time.time() < deadline:
            v = self.value(expr)
            if v is not None and pred(v):
                break
            time.sleep(0.25)
        return v

    def tail(self, n=3000):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--groups", type=int, default=3)
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    if not os.access(a.prometheus, os.X_OK):
        print(f"FAILED: no Prometheus server at {a.prometheus}: this test needs Debian's "
              "`prometheus` package. Run scripts/deps.sh (as root) to install it.")
        return 1
    failures = []
    with oc.TempDir("bitroll_ops_") as tmp:
        mport = oc.free_port()
        server = oc.Server(a.bitroll, a.model, data_dir=os.path.join(tmp, "wal"),
                           extra=["--metrics-bind", f"127.0.0.1:{mport}"],
                           log=os.path.join(tmp, "serve.log"))
        prom = Prometheus(a.prometheus, f"127.0.0.1:{mport}", tmp)
        try:
            server.start()
            prom.start()
            print(f"bitroll serve {server.endpoint}, metrics :{mport}, prometheus :{prom.port}")
            # The first scrape: the counter is there (and at 0: nothing ran yet).
            up = prom.wait('up{job="bitroll"}', lambda v: v == 1)
            if up != 1:
                failures.append(f"prometheus never scraped the service (up={up})")
            base = prom.wait("bitroll_tokens_generated_total", lambda v: True)
            if base is None:
                failures.append("bitroll_tokens_generated_total absent from the scrape")
                base = 0.0
            client = oc.bitroll.Client(server.endpoint, timeout_ms=60000)
            tokens = trajectories = 0
            for g in range(a.groups):
                res = client.submit([[1, 5 + g, 9]], n=4, max_tokens=48, seed=100 + g).result()
                trajectories += len(res)
                tokens += sum(len(t.ids) for t in res)
            client.close()
            print(f"{a.groups} groups: {trajectories} trajectories, {tokens} tokens")
            got = prom.wait("bitroll_tokens_generated_total", lambda v: v >= base + tokens)
            print(f"prometheus: bitroll_tokens_generated_total {base} -> {got}")
            if got != base + tokens:
                failures.append(f"tokens counter moved by {None if got is None else got - base}, "
                                f"the client got {tokens} tokens")
            n = prom.value("sum(bitroll_trajectories_finished_total)")
            if n != trajectories:
                failures.append(f"sum(bitroll_trajectories_finished_total) = {n}, "
                                f"want {trajectories}")
            commits = prom.wait("bitroll_wal_commit_seconds_count", lambda v: v > 0)
            p99 = prom.value("histogram_quantile(0.99, bitroll_wal_commit_seconds_bucket)")
            print(f"prometheus: bitroll_wal_commit_seconds_count {commits}, p99 <= {p99} s")
            if not commits or commits <= 0:
                failures.append(f"WAL commit histogram count {commits}, want > 0")
            kv = prom.value('bitroll_kv_capacity_tokens{replica="local-0"}')
            print(f"prometheus: bitroll_kv_capacity_tokens {kv}")
            if not kv or kv <= 0:
                failures.append(f"bitroll_kv_capacity_tokens = {kv}, want > 0")
            code, body = http_get(f"http://127.0.0.1:{mport}/health")
            if (code, body) != (200, "ready\n"):
                failures.append(f"/health answered {code} {body!r}, want 200 'ready'")
        except Exception as e:  # noqa: BLE001 - reported as a failure with the logs
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            prom.stop()
            server.kill9()
        if failures:
            print("---- bitroll serve log (tail)\n" + server.log_tail())
            print("---- prometheus log (tail)\n" + prom.tail())
    return oc.report("prometheus_scrape", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
