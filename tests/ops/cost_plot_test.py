"""scripts/plot_cost.py and `bitroll cost --plot` on a real run (issue 20, item 4), no screenshot.

Runs a small job on `bitroll serve` with a data directory (groups that repeat prompts, so the
prefix cache has hits, and longer ones past --long-context), records its trajectories as JSON Lines
with their arrival times, draws the PNG and checks it: the PNG signature, more than MIN_BYTES,
the size the script draws, and more than MIN_COLOURS distinct colours once decoded with
matplotlib's imread. Negative controls: a blank figure of the same size stays under the colour
threshold, and records with no trajectory give exit status 1 and no PNG.

--save PATH keeps the picture (docs/img/cost_report.png is made this way, with --groups 8).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "outside"))
import outside_common as oc  # noqa: E402

PLOT = os.path.join(oc.ROOT, "scripts", "plot_cost.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_BYTES = 20_000
MIN_COLOURS = 64


def run_job(endpoint, records, groups):
    """`groups` groups on the service at once, one client thread each: even groups repeat the
    same prompts (prefix cache hits), odd ones have long prompts and answers (long_context).
    Writes each trajectory's record with its arrival time ("received_s")."""
    rng = oc.np.random.default_rng(5)
    base = [[1] + rng.integers(3, 500, 40).tolist() for _ in range(2)]
    specs = []
    for g in range(groups):
        if g % 2 == 0:
            specs.append((base, 16))
        else:
            specs.append(([[1] + rng.integers(3, 500, 60).tolist()], 48))
    got, errors, lock = [], [], threading.Lock()
    ctx = oc.zmq.Context.instance()

    def one(g):
        prompts, max_tokens = specs[g]
        client = oc.bitroll.Client(endpoint, timeout_ms=60000, context=ctx)
        try:
            group = client.submit(prompts, n=4, params={"temperature": 1.0}, seed=100 + g,
                                  max_tokens=max_tokens, group_id=g + 1)
            for t in group:
                rec = json.loads(t.to_json())
                rec["received_s"] = time.time()
                with lock:
                    got.append(rec)
        except Exception as e:  # noqa: BLE001  reported by the caller
            errors.append(f"group {g + 1}: {e}")
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(g,)) for g in range(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    with open(records, "w") as f:
        for rec in sorted(got, key=lambda r: r["received_s"]):
            f.write(json.dumps(rec) + "\n")
    return len(got)


def colours(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    img = plt.imread(path)
    flat = (img.reshape(-1, img.shape[-1]) * 255).round().astype(oc.np.uint8)
    return img.shape, len(oc.np.unique(flat, axis=0))


def check_png(path, failures, label):
    if not os.path.exists(path):
        failures.append(f"{label}: no PNG written")
        return
    with open(path, "rb") as f:
        head = f.read(8)
    size = os.path.getsize(path)
    if head != PNG_SIGNATURE:
        failures.append(f"{label}: not a PNG (starts {head!r})")
        return
    if size <= MIN_BYTES:
        failures.append(f"{label}: {size} bytes, want > {MIN_BYTES}")
    shape, n = colours(path)
    if shape[0] < 500 or shape[1] < 800:
        failures.append(f"{label}: {shape[1]}x{shape[0]} pixels, want >= 800x500")
    if n <= MIN_COLOURS:
        failures.append(f"{label}: {n} distinct colours, want > {MIN_COLOURS}")
    print(f"{label}: {size} bytes, {shape[1]}x{shape[0]}, {n} colours", flush=True)


def blank_colours(tmp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(11, 7.5), dpi=100)
    path = os.path.join(tmp, "blank.png")
    fig.savefig(path, format="png")
    plt.close(fig)
    return colours(path)[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bitroll", default=oc.default_bitroll())
    ap.add_argument("--model", default=oc.default_model())
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--save", default=None, help="keep the PNG here")
    a = oc.parse_args(ap)
    if a is None:
        return 0
    t0 = time.time()
    failures = []
    with oc.TempDir("bitroll_plot_") as tmp:
        server = oc.Server(a.bitroll, a.model, data_dir=os.path.join(tmp, "data"),
                           log=os.path.join(tmp, "serve.log")).start()
        records = os.path.join(tmp, "records.jsonl")
        try:
            n = run_job(server.endpoint, records, a.groups)
        finally:
            server.kill9()
        print(f"{n} trajectories recorded", flush=True)
        png = os.path.join(tmp, "cost.png")
        argv = ["/usr/bin/python3", PLOT, records, "--out", png, "--bitroll", a.bitroll,
                "--price-replica-hour", "2.5", "--long-context", "80"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            failures.append(f"plot_cost exit {r.returncode}: {r.stderr}")
        check_png(png, failures, "cost.png")
        # The same through `bitroll cost --plot`, which runs the script: found beside the
        # executable in a build folder of the checkout, else named by BITROLL_PLOT_SCRIPT.
        png2 = os.path.join(tmp, "cost_cli.png")
        env = dict(os.environ)
        beside = os.path.join(os.path.dirname(os.path.realpath(a.bitroll)), "..", "..",
                              "scripts", "plot_cost.py")
        if not os.path.exists(beside):
            env["BITROLL_PLOT_SCRIPT"] = PLOT
        r = subprocess.run([a.bitroll, "cost", records, "--plot", png2, "--price-replica-hour",
                            "2.5", "--long-context", "80"], capture_output=True, text=True,
                           timeout=120, env=env)
        if r.returncode != 0:
            failures.append(f"bitroll cost --plot exit {r.returncode}: {r.stderr}")
        check_png(png2, failures, "bitroll cost --plot")
        # The regimes the picture shows come from `bitroll cost`: both must be there.
        c = subprocess.run([a.bitroll, "cost", records, "--format", "json", "--long-context",
                            "80"], capture_output=True, text=True, timeout=60)
        regimes = sorted(json.loads(c.stdout)["regimes"]) if c.returncode == 0 else c.stderr
        if regimes != ["long_context", "short_chat"]:
            failures.append(f"regimes of the run: {regimes}")
        blank = blank_colours(tmp)
        if blank > MIN_COLOURS:
            failures.append(f"negative control: a blank figure has {blank} colours")
        empty = os.path.join(tmp, "empty.jsonl")
        open(empty, "w").close()
        bad = os.path.join(tmp, "bad.png")
        r = subprocess.run(["/usr/bin/python3", PLOT, empty, "--out", bad, "--bitroll",
                            a.bitroll], capture_output=True, text=True, timeout=60)
        if r.returncode != 1 or os.path.exists(bad) or "no trajectory" not in r.stderr:
            failures.append(f"negative control: empty records gave exit {r.returncode}, "
                            f"{r.stderr!r}, PNG written: {os.path.exists(bad)}")
        if a.save and os.path.exists(png):
            shutil.copyfile(png, a.save)
            print(f"saved {a.save}")
    return oc.report("cost_plot_test", failures, t0)


if __name__ == "__main__":
    sys.exit(main())
