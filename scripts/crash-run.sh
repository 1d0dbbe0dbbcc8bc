#!/usr/bin/env bash
# Longer crash run: repeats the kill -9 harness (rollout/crash_test.cc: 64 sampled trajectories,
# a `bitroll serve --data-dir` child killed 20 times per repetition, sync and window durability)
# REPEAT times, i.e. 25 * REPEAT kills, and prints the time. Every repetition checks bit-identity
# against an uninterrupted reference with memcmp.
# Usage: scripts/crash-run.sh [BUILD_DIR] [REPEAT]   (default build, 3 => 75 kills)
set -euo pipefail
build="${1:-build}"
repeat="${2:-3}"
test_bin="$build/rollout/rollout_crash_test"
[[ -x "$test_bin" ]] || { echo "build $test_bin first (cmake --build $build --target rollout_crash_test)"; exit 2; }
start=$(date +%s)
"$test_bin" --gtest_repeat="$repeat" --gtest_brief=1
echo "crash-run: $((25 * repeat)) kills in $(( $(date +%s) - start )) s, all bit-identical"
