#!/usr/bin/python3
"""Pictures of a run's cost: one PNG from its trajectory records.

    scripts/plot_cost.py RECORDS.jsonl --out cost.png [--bitroll PATH] [--price-replica-hour USD]
        [--price-sandbox-cpu-hour USD] [--long-context N] [--title TEXT]

RECORDS.jsonl is JSON Lines of trajectories, the input of `bitroll cost` (`bitroll generate --json`,
or a client's Trajectory.to_json()). The totals per group and per regime come from
`bitroll cost RECORDS --format json` (one formula for prices and regimes, the C++ one); the time
axis comes from the records: a record's "received_s" (when the client got it, seconds on any
clock) if the records carry one, else the cumulative engine-seconds of the records in file order.

Four panels: cost per group, cost per regime (price in USD when a price is given, else
engine-seconds), prefill tokens computed vs cached and decode tokens per group, and throughput
over time (decode tokens per second, and finished trajectories). Needs Debian's
python3-matplotlib (scripts/deps.sh). Exit status 0, 1 on an error (printed), 2 on bad arguments.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

COLORS = {"computed": "#d62728", "cached": "#2ca02c", "decode": "#1f77b4",
          "short_chat": "#1f77b4", "long_context": "#ff7f0e", "agentic": "#9467bd"}


class PlotError(Exception):
    pass


def find_bitroll(given):
    for p in (given, os.environ.get("BITROLL_EXE")):
        if p:
            return p
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "build", "rollout", "bitroll")
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("bitroll")
    if found:
        return found
    raise PlotError("no bitroll executable: pass --bitroll or set BITROLL_EXE")


def cost_totals(bitroll, records, a):
    """`bitroll cost RECORDS --format json`: {"trajectories", "groups": [...], "regimes": {...}}."""
    argv = [bitroll, "cost", records, "--format", "json",
            "--price-replica-hour", repr(a.price_replica_hour),
            "--price-sandbox-cpu-hour", repr(a.price_sandbox_cpu_hour)]
    if a.long_context is not None:
        argv += ["--long-context", str(a.long_context)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise PlotError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def read_records(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                raise PlotError(f"{path}:{n}: not JSON: {e}")
            if not isinstance(j, dict):
                raise PlotError(f"{path}:{n}: not a JSON object")
            out.append(j)
    if not out:
        raise PlotError(f"{path} holds no trajectory")
    return out


def timeline(records):
    """Per record (start, end, decode tokens), times starting at 0, and the clock's name. A
    record ends when the client received it ("received_s") and began engine_seconds before;
    records without received_s end at the cumulative engine-seconds of the records before them."""
    spans = []
    timed = all(isinstance(r.get("received_s"), (int, float)) for r in records)
    t = 0.0
    for r in records:
        engine = max(0.0, float(r.get("cost", {}).get("engine_seconds", 0.0)))
        if timed:
            end = float(r["received_s"])
        else:
            t += engine
            end = t
        spans.append((end - engine, end, decode_tokens(r)))
    t0 = min(s for s, _, _ in spans)
    spans = sorted((s - t0, e - t0, d) for s, e, d in spans)
    clock = "seconds since the first record began" if timed else \
        "cumulative engine-seconds (records carry no received_s)"
    return spans, clock


def decode_tokens(r):
    c = r.get("cost", {})
    if "decode_tokens" in c:
        return int(c["decode_tokens"])
    return len(r.get("ids", []))


def throughput(spans, bins):
    """Decode tokens per second in `bins` equal windows over the run: each record's tokens are
    spread evenly over its [start, end]."""
    end = max(e for _, e, _ in spans)
    width = (end if end > 0 else 1.0) / bins
    sums = [0.0] * bins
    for s, e, d in spans:
        if e <= s:
            sums[min(bins - 1, int(e / width))] += d
            continue
        for i in range(max(0, int(s / width)), min(bins, int(e / width) + 1)):
            overlap = min(e, (i + 1) * width) - max(s, i * width)
            if overlap > 0:
                sums[i] += d * overlap / (e - s)
    centers = [(i + 0.5) * width for i in range(bins)]
    return centers, [x / width for x in sums]


def plot(totals, records, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = totals["groups"]
    regimes = totals["regimes"]
    priced = any(g["price_usd"] > 0 for g in groups)
    metric, metric_label = ("price_usd", "price (USD)") if priced else \
        ("engine_seconds", "engine-seconds (no price given)")

    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5), dpi=100)
    fig.suptitle(title or f"bitroll cost: {totals['trajectories']} trajectories, "
                 f"{len(groups)} groups")

    # Cost per group.
    a = ax[0][0]
    names = [str(g["group_id"]) for g in groups]
    a.bar(names, [g[metric] for g in groups], color="#4c72b0")
    a.set_title("cost per group")
    a.set_xlabel("group id")
    a.set_ylabel(metric_label)

    # Cost per regime, with trajectory counts.
    a = ax[0][1]
    rnames = sorted(regimes)
    vals = [regimes[r][metric] for r in rnames]
    bars = a.bar(rnames, vals, color=[COLORS.get(r, "#8c564b") for r in rnames])
    for b, r in zip(bars, rnames):
        a.annotate(f"{regimes[r]['trajectories']} traj.", (b.get_x() + b.get_width() / 2,
                                                           b.get_height()),
                   ha="center", va="bottom", fontsize=9)
    a.set_title("cost per regime")
    a.set_ylabel(metric_label)

    # Tokens: prefill computed vs cached, and decode, per group (stacked prefill).
    a = ax[1][0]
    x = list(range(len(groups)))
    w = 0.4
    comp = [g["prefill_computed"] for g in groups]
    cached = [g["prefill_cached"] for g in groups]
    a.bar([i - w / 2 for i in x], comp, w, label="prefill computed", color=COLORS["computed"])
    a.bar([i - w / 2 for i in x], cached, w, bottom=comp, label="prefill cached",
          color=COLORS["cached"])
    a.bar([i + w / 2 for i in x], [g["decode_tokens"] for g in groups], w, label="decode",
          color=COLORS["decode"])
    a.set_xticks(x, names)
    total_prefill = sum(comp) + sum(cached)
    hit = sum(cached) / total_prefill if total_prefill else 0.0
    a.set_title(f"tokens per group (prefill cache hits {hit:.0%})")
    a.set_xlabel("group id")
    a.set_ylabel("tokens")
    a.legend(fontsize=8)

    # Throughput over time.
    a = ax[1][1]
    spans, xlabel = timeline(records)
    centers, rate = throughput(spans, max(4, min(30, len(spans) // 3)))
    a.plot(centers, rate, color=COLORS["decode"], marker="o", markersize=3,
           label="decode tokens/s")
    a.fill_between(centers, rate, alpha=0.2, color=COLORS["decode"])
    a.set_xlabel(xlabel)
    a.set_ylabel("decode tokens / s")
    a.set_title("throughput over time")
    b = a.twinx()
    ends = sorted(e for _, e, _ in spans)
    b.step(ends, list(range(1, len(ends) + 1)), where="post", color="#ff7f0e",
           label="trajectories done")
    b.set_ylabel("trajectories done")
    lines = a.get_legend_handles_labels()
    more = b.get_legend_handles_labels()
    a.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")

    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", help="trajectories, JSON Lines (the input of `bitroll cost`)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--bitroll", help="the bitroll executable (default: $BITROLL_EXE, the build "
                    "tree's, or bitroll on PATH)")
    ap.add_argument("--price-replica-hour", type=float, default=0.0, metavar="USD")
    ap.add_argument("--price-sandbox-cpu-hour", type=float, default=0.0, metavar="USD")
    ap.add_argument("--long-context", type=int, default=None, metavar="N",
                    help="prompt + generated tokens from which a trajectory is long-context")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    try:
        records = read_records(a.records)
        totals = cost_totals(find_bitroll(a.bitroll), a.records, a)
        plot(totals, records, a.out, a.title)
    except (PlotError, OSError) as e:
        print(f"plot_cost: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"plot_cost: {e} (install Debian's python3-matplotlib: scripts/deps.sh)",
              file=sys.stderr)
        return 1
    print(f"plot_cost: wrote {a.out} ({os.path.getsize(a.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
