#!/usr/bin/env bash
# Longer crash run: repeats the real-engine kill -9 harness (rollout/crash_test.cc: 64 sampled
# stories260K trajectories x 200 tokens; a `bitroll serve --data-dir` child killed 20 times with
# fsync per commit and 5 times with window durability per repetition) REPEAT times, i.e.
# 25 * REPEAT kills, and prints the time. Every repetition checks bit-identity against an
# uninterrupted run of the engine alone with memcmp, and that no logged token was regenerated.
# Usage: scripts/crash-run.sh [BUILD_DIR] [REPEAT]   (default build, 2 => 50 kills)
set -euo pipefail
build="${1:-build}"
repeat="${2:-2}"
test_bin="$build/rollout/rollout_crash_test"
[[ -x "$test_bin" ]] || { echo "build $test_bin first (cmake --build $build --target rollout_crash_test)"; exit 2; }
start=$(date +%s)
"$test_bin" --gtest_filter='CrashTest.RealEngine*' --gtest_repeat="$repeat" --gtest_brief=1
echo "crash-run: $((25 * repeat)) kills of the real engine in $(( $(date +%s) - start )) s, all bit-identical"
