#!/usr/bin/env bash
# The regime report (issue 17, docs/regimes.md): writes make-model's hybrid-bench model, the five
# regime traces, replays each through `bitroll serve` under a small sweep of settings, and writes
# docs/regimes.md with its plots in docs/img/. About 20 minutes on two cores.
#   scripts/regime-report.sh                 # build dir: ${BITROLL_BUILD_DIR:-build}
#   REGIME_WORK=DIR   keep the model, traces and per-run results there (default: a temp folder)
#   REGIME_SCALE=0.6  scale every trace's request count (default 0.6)
#   REGIME_ONLY=chat  one regime only
#   REGIME_REPS=3     runs per regime and setting (the report gives their medians)
# Needs the `bitroll` and `bitroll_python` targets built, and /usr/bin/python3 with numpy, pyzmq,
# flatbuffers and matplotlib (scripts/deps.sh installs them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"
bitroll="$build/rollout/bitroll"
[ -x "$bitroll" ] || { echo "regime-report: no $bitroll (build the bitroll target)" >&2; exit 1; }
if [ ! -d "$build/python/bitroll" ]; then
  echo "regime-report: no $build/python/bitroll (build the bitroll_python target)" >&2
  exit 1
fi
work="${REGIME_WORK:-}"
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
"$bitroll" make-model --shape hybrid-bench --out "$work/model" >/dev/null
only=()
[ -n "${REGIME_ONLY:-}" ] && only=(--only "$REGIME_ONLY")
# The command as the report shows it: with the settings that differ from the defaults.
cmd="scripts/regime-report.sh"
for v in REGIME_ONLY REGIME_REPS REGIME_SCALE; do
  [ -n "${!v:-}" ] && cmd="$v=${!v} $cmd"
done
PYTHONPATH="$build/python" /usr/bin/python3 "$root/tests/bench/regimes/report.py" \
  --bitroll "$bitroll" --model "$work/model" --work "$work" \
  --md "$root/docs/regimes.md" --img "$root/docs/img" \
  --scale "${REGIME_SCALE:-0.6}" --reps "${REGIME_REPS:-3}" "${only[@]}" \
  --command "$cmd"
