#!/usr/bin/env bash
# Re-score vs re-run throughput of `bitroll audit` (docs/benchmarks.md "Audit"), by hand.
#
#   scripts/bench_audit.sh MODEL [TRAJECTORIES] [TOKENS] [REPS] [THREADS]
#
# Generates TRAJECTORIES records of TOKENS tokens (one prompt, n = TRAJECTORIES, temperature 0.8,
# no EOS stop is possible to force, so short ones happen) with `bitroll generate --json`, then
# audits them REPS times in each mode and prints the median tokens checked per second of engine
# time (the `tokens_per_second` of `bitroll audit --json`) and their ratio. Machines are shared
# and noisy: medians, and both modes run alternately in one invocation.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bitroll="${BITROLL_EXE:-$root/build/rollout/bitroll}"
model="$1"
n="${2:-16}"
tokens="${3:-200}"
reps="${4:-5}"
threads="${5:-1}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bitroll" generate --model "$model" --prompt "Once upon a time" -n "$n" --temperature 0.8 \
  --max-tokens "$tokens" --threads "$threads" --json >"$work/records.jsonl" 2>"$work/gen.err"
gen_tps="$(sed -n 's/.* \([0-9.]*\) tok\/s.*/\1/p' "$work/gen.err")"
for ((i = 0; i < reps; i++)); do
  for mode in rescore rerun; do
    "$bitroll" audit "$work/records.jsonl" --model "$model" --mode "$mode" --threads "$threads" \
      --json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin); \
assert j["exit_status"] == 0, j["counts"]; print(j["tokens_per_second"], j["tokens_checked"])' \
      >>"$work/$mode.txt"
  done
done
python3 - "$work" "$gen_tps" "$(basename "$model")" "$n" "$threads" <<'EOF'
import statistics, sys
work, gen_tps, name, n, threads = sys.argv[1:]
med = {}
for mode in ("rescore", "rerun"):
    rows = [line.split() for line in open(f"{work}/{mode}.txt")]
    med[mode] = statistics.median(float(r[0]) for r in rows)
    toks = rows[0][1]
print(f"{name}: {n} trajectories, {toks} tokens, threads {threads}: rescore {med['rescore']:.0f} "
      f"tok/s, rerun {med['rerun']:.0f} tok/s (generate {float(gen_tps):.0f} tok/s): "
      f"rescore/rerun {med['rescore'] / med['rerun']:.1f}x (median of {len(rows)})")
EOF
