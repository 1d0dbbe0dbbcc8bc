#!/usr/bin/env bash
# scripts/device-check.sh [OUTDIR] -- the one prepared GPU check of the CUDA backend (issue 7).
# scripts/device-check.sh --prepare-deps -- run HERE (the CI machine) before the device run: copies
#   what the GPU image may lack into build-deps/ (ignored; name it in the device tool's `carry`):
#   googletest sources, a small sysroot (xxhash, pcre2 static libraries and headers, nlohmann
#   json) for the engine module, and the test models (stories260K.bin, tok512.bin, golden/).
#
# On a machine with an NVIDIA GPU (written for one H200, 16 cores): configures and builds
# kernels/cuda and the CUDA engine backend (engine/cuda) for sm_90a (+ compute_90 PTX) in its own
# build dir, runs the CUDA test suites (kernels and engine), then the GEMM, attention and
# whole-model decode benchmarks with bounded repetitions. If the engine module cannot be
# configured there (missing libraries), the kernel checks still run and the summary says so.
# Full logs go to OUTDIR (default: $OUT when set, else ./device-check-out), at most 8 files:
#   build.log (nvidia-smi, configure, build) tests.log bench_gemm.log bench_gemm.csv
#   bench_attention.log bench_attention.csv bench_engine.log summary.txt
# A short summary table is printed LAST. Every step runs under `timeout` inside an overall
# budget (BITROLL_CHECK_BUDGET_S, default 460 s), so the script never hangs.
# Exit status: 0 all tests passed; 1 a test failed or timed out, or found no usable device, or
# the engine was not built; 2 the build failed; 3 tests passed but a benchmark failed.
# GoogleTest: the installed one when CMake finds it; otherwise it is built from GTEST_SOURCE_DIR,
# <repo>/build-deps/googletest or /usr/src/googletest, whichever exists first.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/build-deps"

if [ "${1:-}" = "--prepare-deps" ]; then
  # Here, not on the GPU machine: fill build-deps/ from this machine's packages.
  set -e
  models="${BITROLL_MODELS_DIR:-$root/../shared/models}"
  sys="$deps/sysroot/usr"
  arch="lib/x86_64-linux-gnu"
  mkdir -p "$deps/models/golden" "$sys/include" "$sys/$arch/pkgconfig" "$sys/share/cmake"
  [ -d "$deps/googletest" ] || cp -r /usr/src/googletest "$deps/"
  cp /usr/include/xxhash.h /usr/include/pcre2.h "$sys/include/"
  cp -r /usr/include/nlohmann "$sys/include/"
  cp /usr/$arch/libxxhash.a /usr/$arch/libpcre2-8.a "$sys/$arch/"
  cp /usr/$arch/pkgconfig/libpcre2-8.pc "$sys/$arch/pkgconfig/"
  cp -r /usr/share/cmake/nlohmann_json "$sys/share/cmake/"
  # pkg-config (pkgconf) itself, used there only when the image has none.
  mkdir -p "$sys/bin"
  cp "$(readlink -f "$(command -v pkg-config)")" "$sys/bin/pkg-config"
  for l in $(ldd "$sys/bin/pkg-config" | awk '/libpkgconf/ { print $3 }'); do cp "$l" "$sys/$arch/"; done
  cp "$models/stories260K.bin" "$models/tok512.bin" "$deps/models/"
  cp "$models"/golden/* "$deps/models/golden/"
  du -sh "$deps"
  echo "carry build-deps: run(command=\"bash scripts/device-check.sh \$OUT\", carry=[\"build-deps\"])"
  exit 0
fi

# Carried dependencies (see --prepare-deps): static libraries and headers, the test models.
if [ -d "$deps/sysroot/usr" ]; then
  export PKG_CONFIG_SYSROOT_DIR="$deps/sysroot"
  export PKG_CONFIG_PATH="$deps/sysroot/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CMAKE_PREFIX_PATH="$deps/sysroot/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$deps/sysroot/usr/bin/pkg-config" ]; then
    export PATH="$deps/sysroot/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$deps/sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
if [ -z "${BITROLL_MODELS_DIR:-}" ]; then
  if [ -f "$deps/models/stories260K.bin" ]; then
    export BITROLL_MODELS_DIR="$deps/models"
  else
    export BITROLL_MODELS_DIR="$root/../shared/models"
  fi
fi
out="${1:-${OUT:-$root/device-check-out}}"
build="${BITROLL_DEVICE_BUILD_DIR:-$root/build-device-check}"
jobs="${BITROLL_JOBS:-$(nproc)}"
budget="${BITROLL_CHECK_BUDGET_S:-460}"
mkdir -p "$out"
t_start=$(date +%s)
status=0
lines=()

remaining() { echo $((budget - ($(date +%s) - t_start))); }
# cap LIMIT: LIMIT, or less when the overall budget is running out (never below 5 s).
cap() {
  local r
  r=$(($(remaining) - 5))
  if [ "$r" -lt "$1" ]; then echo $((r > 5 ? r : 5)); else echo "$1"; fi
}
# step NAME LIMIT LOG CMD...: runs CMD under timeout, appending to LOG; returns its status.
step() {
  local name=$1 limit=$2 log=$3 t0 rc
  shift 3
  limit=$(cap "$limit")
  t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  echo "[$name] exit $rc after $(($(date +%s) - t0))s" | tee -a "$log"
  return $rc
}

echo "bitroll device check: repo $root, build $build, logs $out, $jobs jobs, budget ${budget}s"
echo "models: $BITROLL_MODELS_DIR"
: >"$out/build.log"
step nvidia-smi 30 "$out/build.log" nvidia-smi
head -n 20 "$out/build.log"

# ---- build ----
modules="schema;kernels;engine"
configure() {
  step configure 120 "$out/build.log" cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBITROLL_MODULES="$modules" -DBITROLL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="90a-real;90-virtual" "$@"
}
build_ok=1
tests_built=1
engine_ok=1
# configure, and when the engine module's libraries are missing (xxhash, pcre2, nlohmann json,
# pkg-config: carry build-deps, see --prepare-deps), configure again without it: the kernels are
# still checked.
try_configure() {
  configure "$@" && return 0
  if [ "$engine_ok" = 1 ] &&
    grep -qiE 'xxhash|pcre2|nlohmann|PkgConfig|engine/[a-z_/]+\.cmake' "$out/build.log"; then
    echo "engine module not configurable here: checking the kernels only" | tee -a "$out/build.log"
    engine_ok=0
    modules="schema;kernels"
    rm -rf "$build"
    configure "$@" && return 0
  fi
  return 1
}
if ! try_configure; then
  gtest_ok=0
  gtest_src=""
  for d in "${GTEST_SOURCE_DIR:-}" "$root/build-deps/googletest" /usr/src/googletest; do
    if [ -n "$d" ] && [ -f "$d/CMakeLists.txt" ]; then gtest_src=$d; break; fi
  done
  if [ -n "$gtest_src" ]; then
    echo "configure failed; building GoogleTest from $gtest_src" | tee -a "$out/build.log"
    rm -rf "$build"
    step gtest-configure 60 "$out/build.log" cmake -S "$gtest_src" -B "$build-gtest" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$build-gtest/install" &&
      step gtest-build 120 "$out/build.log" cmake --build "$build-gtest" -j "$jobs" \
        --target install &&
      try_configure -DCMAKE_PREFIX_PATH="$build-gtest/install" && gtest_ok=1
  fi
  if [ "$gtest_ok" != 1 ]; then
    # Still measure: the benchmarks need no GoogleTest.
    echo "no usable GoogleTest: building the benchmarks only" | tee -a "$out/build.log"
    rm -rf "$build"
    tests_built=0
    try_configure -DBITROLL_BUILD_TESTS=OFF || build_ok=0
  fi
fi
tests=(kernels_cuda_host_test kernels_cuda_gemm_test kernels_cuda_ops_test
  kernels_cuda_attention_test kernels_cuda_sampling_test kernels_cuda_collectives_test)
benches=(bench_cuda_gemm bench_cuda_attention)
if [ "$engine_ok" = 1 ]; then
  tests+=(cuda_engine_test)
  benches+=(bench_cuda_engine)
  # NCCL weight broadcast receiver (engine/nccl_weights.h): the timeout/abort path on 1 GPU; the
  # 2-rank bit-exact broadcast skips ("needs 2 GPUs") on a one-GPU machine.
  tests+=(engine_nccl_weights_test)
fi
# binary NAME: where the target's executable lands.
binary() {
  case "$1" in
    cuda_engine_test | bench_cuda_engine | engine_nccl_weights_test) echo "$build/engine/$1" ;;
    *) echo "$build/kernels/$1" ;;
  esac
}
targets=("${benches[@]}")
if [ "$tests_built" = 1 ]; then targets=("${tests[@]}" "${benches[@]}"); fi
if [ "$build_ok" = 1 ]; then
  step build 300 "$out/build.log" cmake --build "$build" -j "$jobs" --target "${targets[@]}" ||
    build_ok=0
fi
if [ "$build_ok" != 1 ]; then
  lines+=("build                FAILED (see build.log)")
  status=2
elif [ "$tests_built" != 1 ]; then
  lines+=("tests                NOT BUILT: no GoogleTest (carry build-deps/googletest)")
  status=1
fi
if [ "$engine_ok" != 1 ]; then
  lines+=("engine               NOT BUILT: no xxhash/pcre2/nlohmann (run --prepare-deps, carry build-deps)")
  status=1
fi

# ---- tests ----
: >"$out/tests.log"
if [ "$build_ok" = 1 ] && [ "$tests_built" = 1 ]; then
  for t in "${tests[@]}"; do
    bin="$(binary "$t")"
    log1="$build/$t.log"
    : >"$log1"
    step "$t" 150 "$log1" "$bin" --gtest_color=no
    rc=$?
    cat "$log1" >>"$out/tests.log"
    passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log1" | grep -oE '[0-9]+$' | tail -n 1)
    failed=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log1" | grep -oE '[0-9]+' | tail -n 1)
    skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log1" | grep -oE '[0-9]+' | tail -n 1)
    no_device=$(grep -c '^\[  SKIPPED \] no CUDA device' "$log1")
    rm -f "$log1"
    verdict=ok
    if [ "$rc" -ne 0 ] || [ "${failed:-0}" != 0 ]; then verdict="FAILED (exit $rc)"; fi
    # On the GPU machine no test may skip for want of a device (skips for want of a second GPU
    # or of NCCL are listed, not failed).
    if [ "${no_device:-0}" != 0 ]; then verdict="FAILED (no usable CUDA device)"; fi
    [ "$verdict" = ok ] || status=1
    lines+=("$(printf '%-29s passed %3s failed %3s skipped %3s  %s' "$t" "${passed:-0}" \
      "${failed:-0}" "${skipped:-0}" "$verdict")")
  done
fi

# ---- benchmarks ----
: >"$out/bench_gemm.log"
: >"$out/bench_attention.log"
: >"$out/bench_engine.log"
bench_status=0
if [ "$build_ok" = 1 ]; then
  step bench_cuda_gemm 130 "$out/bench_gemm.log" "$build/kernels/bench_cuda_gemm" --reps=15 \
    --csv="$out/bench_gemm.csv" || bench_status=1
  step bench_cuda_attention 100 "$out/bench_attention.log" \
    "$build/kernels/bench_cuda_attention" --reps=8 --csv="$out/bench_attention.csv" ||
    bench_status=1
  if [ "$engine_ok" = 1 ]; then
    step bench_cuda_engine 100 "$out/bench_engine.log" "$build/engine/bench_cuda_engine" \
      --batches=1,16,64,256 --context=128 --steps=32 || bench_status=1
  fi
fi
if [ "$status" = 0 ] && [ "$bench_status" != 0 ]; then status=3; fi

# ---- summary (printed last) ----
{
  echo
  echo "================ bitroll device check: summary ================"
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)
  echo "gpu: $(echo "$gpu" | head -n 1)"
  for l in "${lines[@]}"; do echo "$l"; done
  if [ -s "$out/bench_gemm.csv" ]; then
    echo "-- GEMM ours/cuBLAS throughput (bf16 out); columns M=1 16 64 256 1024 4096 (as run)"
    awk -F, 'NR > 1 { key = $1 " " $2; if (!(key in row)) order[n++] = key;
                      row[key] = row[key] sprintf(" %5.2f", $11) }
             END { for (i = 0; i < n; ++i) printf "  %-34s%s\n", order[i], row[order[i]] }' \
      "$out/bench_gemm.csv"
  fi
  grep -h '^SUMMARY' "$out/bench_gemm.log" 2>/dev/null
  if [ -s "$out/bench_attention.csv" ]; then
    echo "-- attention dual/flash throughput | dual fraction of HBM; columns = contexts (as run)"
    awk -F, 'NR > 1 { if (!($1 in row)) order[n++] = $1;
                      row[$1] = row[$1] sprintf(" %5.2f|%4.2f", $11, $12) }
             END { for (i = 0; i < n; ++i) printf "  batch %-4s%s\n", order[i], row[order[i]] }' \
      "$out/bench_attention.csv"
  fi
  grep -h '^SUMMARY\|^HBM' "$out/bench_attention.log" 2>/dev/null
  if [ -s "$out/bench_engine.log" ]; then
    echo "-- whole-model decode (random-weight qwen0.5b-like, context 128): tok/s"
    grep -h '^model \|^ *batch \|^ *[0-9][0-9]* ' "$out/bench_engine.log" | sed 's/^/  /'
    grep -h '^SUMMARY' "$out/bench_engine.log"
  fi
  echo "total $(($(date +%s) - t_start))s; exit status $status (0 ok, 1 test, 2 build, 3 bench)"
} | tee "$out/summary.txt"
exit "$status"
