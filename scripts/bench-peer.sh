#!/usr/bin/env bash
# bitroll against llama.cpp on this machine, run by hand (never part of the test suite):
#   scripts/bench-peer.sh [--reps N] [--threads T] [--kv f32|16|both] [--cases "NAME,NAME"]
#                         [--work DIR]
# The cases are bench_engine --attention-suite's (default: b1 ctx256, b1 ctx4096, b32 p128+128,
# b1 prompt 512; on request b1 ctx16384 and the "gqa" cases, with 3 kv heads: gqa b1 ctx4096,
# gqa b1 ctx16384, gqa b32 p128+128), on the stories110m shape with random weights on both sides,
# greedy, --threads threads (default 2). The peer is llama.cpp as the npm package node-llama-cpp
# ships it prebuilt (its CPU libraries pick the best backend for the CPU at run time), driven by
# scripts/peer/bench_llama_cpp.mjs with flash attention on, on a GGUF that
# scripts/peer/make_gguf.py writes with the same shape. --kv f32 pairs fp32 K/V on both sides,
# --kv 16 pairs bitroll's bf16 K/V with llama.cpp's default f16 K/V (issue 19's target), both
# (default) runs the two. Each rep runs bitroll then the peer, the next rep the peer first;
# prints every run and then, per case, the medians and bitroll / llama.cpp (of the medians, and
# the range of the per-rep ratios), and for decode both engines' tok/s as a % of the bandwidth
# roofline (bitroll's bytes per step at the read bandwidth bench_engine measured around that case
# in that rep).
# Needs node and npm (Debian: nodejs npm) and the npm registry once; the peer goes into WORK/peer
# (default WORK: build/bench-work), about 85 MB, and each GGUF about 540 MB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"
work="$build/bench-work"
reps=3
threads=2
kv=both
cases="b1 ctx256,b1 ctx4096,b32 p128+128,b1 prompt 512"
usage() {
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="${2:?}"; shift 2 ;;
    --threads) threads="${2:?}"; shift 2 ;;
    --kv) kv="${2:?}"; shift 2 ;;
    --cases) cases="${2:?}"; shift 2 ;;
    --work) work="${2:?}"; shift 2 ;;
    *) usage ;;
  esac
done
case "$kv" in
  f32) pairs=("f32 f32") ;;
  16) pairs=("bf16 f16") ;;
  both) pairs=("f32 f32" "bf16 f16") ;;
  *) usage ;;
esac
# The cases both sides run (bench_llama_cpp.mjs's list); checked before anything runs.
IFS=, read -ra want <<<"$cases"
for c in "${want[@]}"; do
  case "${c#gqa }" in
    "b1 ctx256" | "b1 ctx4096" | "b32 p128+128" | "b1 prompt 512" | "b1 ctx16384") ;;
    *)
      echo "bench-peer: no peer case \"$c\" (b1 ctx256, b1 ctx4096, b32 p128+128, b1 prompt 512," \
        "b1 ctx16384, each also with \"gqa \" before it)" >&2
      exit 2
      ;;
  esac
done
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "bench-peer: node and npm are needed for the peer (apt-get install nodejs npm)" >&2
  exit 1
fi

"$root/scripts/build.sh"
peer="$work/peer"
packages=(node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
marker="$peer/.installed-$(printf '%s\n' "${packages[@]}" | md5sum | cut -c1-12)"
if [ ! -f "$marker" ]; then
  mkdir -p "$peer"
  # --ignore-scripts: node-llama-cpp's postinstall would look for a build of its own; the
  # prebuilt linux-x64 package is what runs. --omit=optional: no CUDA/Vulkan/ARM builds.
  npm install --prefix "$peer" --no-audit --no-fund --no-save --omit=optional --ignore-scripts \
    "${packages[@]}" >&2
  touch "$marker"
fi
cp "$root/scripts/peer/bench_llama_cpp.mjs" "$peer/"  # imports resolve from the script's folder
gguf="$peer/stories110m-17k.gguf"
[ -f "$gguf" ] || python3 "$root/scripts/peer/make_gguf.py" --out "$gguf" >&2
gguf_gqa="$peer/stories110m-gqa4-17k.gguf"  # the suite's "gqa" cases: 3 kv heads
if [[ ",$cases" == *",gqa "* ]] && [ ! -f "$gguf_gqa" ]; then
  python3 "$root/scripts/peer/make_gguf.py" --out "$gguf_gqa" --kv-heads 3 >&2
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Echoes its input to stderr and appends, from each line that starts with PREFIX ("rep 0 | case |
# prefill X tok/s | decode Y tok/s | ...", with bitroll's "..., M MB/step ..."), "SIDE KV case
# REP X Y M" to the log; from such a bitroll line that ends with the rep's roofline ("| roofline P
# GFLOP/s B GB/s"), "bw KV case REP B - -"; and from bitroll's "roofline used" line (the median of
# the run's measurements) "bw KV - REP GB/s - -".
record() {  # SIDE KV REP PREFIX
  awk -v side="$1" -v kv="$2" -v rep="$3" -v prefix="$4" -F' [|] ' '{ print > "/dev/stderr" }
    index($0, prefix) == 1 {
      p = $3; d = $4; sub(/prefill /, "", p); sub(/ tok\/s.*/, "", p)
      sub(/decode /, "", d); sub(/ tok\/s.*/, "", d)
      mb = "-"
      if (match($0, /[0-9.]+ MB\/step/)) mb = substr($0, RSTART, RLENGTH - 8)
      print side "\t" kv "\t" $2 "\t" rep "\t" p "\t" d "\t" mb
      if (match($0, /roofline [0-9.]+ GFLOP\/s [0-9.]+ GB\/s/)) {
        r = substr($0, RSTART, RLENGTH); sub(/ GB\/s$/, "", r); sub(/.* /, "", r)
        print "bw\t" kv "\t" $2 "\t" rep "\t" r "\t-\t-" } }
    /^roofline used/ && match($0, /read bandwidth [0-9.]+ GB\/s/) {
      print "bw\t" kv "\t-\t" rep "\t" substr($0, RSTART + 15, RLENGTH - 20) "\t-\t-" }' >>"$log"
}
run_bitroll() {  # KV REP
  echo "# bitroll, kv $1, rep $2" >&2
  "$build/tests/bench_engine" --attention-suite --work "$work" --reps 1 --threads "$threads" \
    --kv-dtype "$1" --cases "$cases" | record bitroll "$1" "$2" "rep 0 | "
}
run_peer() {  # KV REP
  echo "# llama.cpp, kv $1, rep $2" >&2
  local IFS=,
  for c in $cases; do
    local m="$gguf"
    [[ "$c" == "gqa "* ]] && m="$gguf_gqa"
    (cd "$peer" && node bench_llama_cpp.mjs --model "$m" --case "$c" --threads "$threads" \
      --kv "$1") | record llama.cpp "$1" "$2" "peer | "
  done
}
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# machine: $(nproc) cores, $cpu, $(date -u '+%F %H:%M UTC')"
for pair in "${pairs[@]}"; do
  read -r bkv pkv <<<"$pair"
  for ((r = 0; r < reps; ++r)); do
    if ((r % 2 == 0)); then
      run_bitroll "$bkv" "$r"
      run_peer "$pkv" "$r"
    else
      run_peer "$pkv" "$r"
      run_bitroll "$bkv" "$r"
    fi
  done
done
python3 - "$log" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
f = lambda v: None if v == "-" else float(v)
# A peer kv -> the bitroll kv it is paired with.
pair = {"f32": "f32", "bf16": "bf16", "f16": "bf16"}
batch = lambda case: 32 if "b32" in case else 1
# bw: (bitroll kv, case, rep) -> GB/s, the case's own roofline in that rep, or with case "-" the
# median of the rep's run (bench_engine builds that print no per-rep roofline).
runs, bw, mb = {}, {}, {}  # (bitroll kv, case, side, rep) -> (prefill, decode); GB/s; MB/step
for side, kv, case, rep, p, d, m in rows:
    if side == "bw":
        bw[(kv, case, rep)] = float(p)
        continue
    runs[(pair[kv], case, side, rep)] = (f(p), f(d))
    if f(m):
        mb[(pair[kv], case)] = f(m)  # the same every rep: bytes one decode step reads
# Decode % bw: tok/s against bitroll's read-bandwidth roofline of the case in that rep (both
# engines read the same bytes per step: the same weights, and K/V of the same element size).
print("\n| K/V (bitroll / llama.cpp) | case | phase | bitroll tok/s | llama.cpp tok/s "
      "| ratio of medians | per-rep ratios | bitroll % bw | llama.cpp % bw |")
print("|---|---|---|---|---|---|---|---|---|")
for bkv in dict.fromkeys(k[0] for k in runs):
    for case in dict.fromkeys(k[1] for k in runs if k[0] == bkv):
        reps = sorted({k[3] for k in runs if k[0] == bkv and k[1] == case})
        for i, phase in enumerate(("prefill", "decode")):
            b = [runs.get((bkv, case, "bitroll", r), (None, None))[i] for r in reps]
            l = [runs.get((bkv, case, "llama.cpp", r), (None, None))[i] for r in reps]
            pairs = [(x, y, r) for x, y, r in zip(b, l, reps) if x and y]
            if not pairs:
                continue
            med_b = statistics.median(x for x, _, _ in pairs)
            med_l = statistics.median(y for _, y, _ in pairs)
            ratios = sorted(x / y for x, y, _ in pairs)
            pct = ["-", "-"]
            if phase == "decode" and (bkv, case) in mb:
                def rep_bw(r):
                    return bw.get((bkv, case, r), bw.get((bkv, "-", r)))
                for j in (0, 1):
                    v = [t[j] * mb[(bkv, case)] / batch(case) / 1e3 / rep_bw(t[2])
                         for t in pairs if rep_bw(t[2])]
                    if v:
                        pct[j] = "%.0f%%" % (100 * statistics.median(v))
            kvname = "bf16 / f16" if bkv == "bf16" else "f32 / f32"
            print("| %s | %s | %s | %.1f | %.1f | %.2fx | %.2f-%.2f | %s | %s |" %
                  (kvname, case, phase, med_b, med_l, med_b / med_l, ratios[0], ratios[-1], *pct))
PY
