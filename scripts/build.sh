#!/usr/bin/env bash
# Configures and builds bitroll into ${BITROLL_BUILD_DIR:-build}. Extra arguments go to cmake.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"
"$root/scripts/deps.sh"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >&2
elif [ $# -gt 0 ]; then
  cmake -S "$root" -B "$build" "$@" >&2
fi
cmake --build "$build" -j "$(nproc)" >&2
