#!/usr/bin/env bash
# Runs the benchmarks by hand (never part of the test suite) and prints their tables, for
# docs/benchmarks.md. Machines are shared and noisy: every figure is a median of repetitions, and
# ratios are taken within one run.
#
#   scripts/bench.sh [kernels|engine|serving|wal|wal_service|sandbox|coordinator|service|
#                     weights_update|swa_cache ...]
#   (default: all but service, wal_service and swa_cache, which take minutes)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
work="$build/bench-work"
mkdir -p "$work"
models="$root/../shared/models"
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(kernels engine serving wal sandbox coordinator)
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%F)"
for b in "${want[@]}"; do
  exe="$(find "$build" -type f -name "bench_$b" -perm -u+x | head -n 1)"
  if [ -z "$exe" ]; then
    echo "## bench_$b: not built" >&2
    continue
  fi
  echo
  echo "## bench_$b"
  case "$b" in
    kernels) "$exe" --reps=5 ;;
    engine) "$exe" --models-dir "$models" --work "$work" --reps 3 ;;
    serving) "$exe" --work "$work" ;;
    service | wal_service) "$exe" --models "$models" --work "$work" ;;
    weights_update) "$exe" --work "$work/weights" ;;
    swa_cache) "$exe" --work "$work" ;;
    *) "$exe" ;;
  esac
done
