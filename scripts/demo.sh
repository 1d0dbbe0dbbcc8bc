#!/usr/bin/env bash
# The README's first command: installs what is missing (as root), builds, and runs the main job
# on the default model.
#
#   scripts/demo.sh [--model PATH] [--tokenizer PATH]      (or BITROLL_MODEL=PATH)
#
# The default model is stories260K from ../shared/models beside the checkout. Without a model the
# demo says where to get one and falls back to a random-weight model from `bitroll make-model`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"

model="${BITROLL_MODEL:-}"
tokenizer=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --tokenizer) tokenizer="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

"$root/scripts/build.sh"
bitroll="$build/rollout/bitroll"
# The Python examples import the bitroll package the build made (python/CMakeLists.txt).
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"

if [ -z "$model" ] && [ -f "$root/../shared/models/stories260K.bin" ]; then
  model="$root/../shared/models/stories260K.bin"
fi
if [ -z "$model" ]; then
  cat >&2 <<'MSG'
bitroll demo: no model found. A real small model is stories260K.bin + tok512.bin from the
llama2.c "tinyllamas" release (Karpathy, Hugging Face karpathy/tinyllamas, folder stories260K/);
pass it with --model PATH or BITROLL_MODEL=PATH.
Falling back to a RANDOM-WEIGHT model from `bitroll make-model`: its text will be gibberish.
MSG
  "$bitroll" make-model --shape stories15m --out "$build/demo-model" --seed 1
  model="$build/demo-model/model.bin"
fi
targs=()
[ -n "$tokenizer" ] && targs=(--tokenizer "$tokenizer")

echo "== bitroll generate: greedy, the llama2.c reference's own setting =="
"$bitroll" generate --model "$model" "${targs[@]}" --prompt "Once upon a time" \
  --temperature 0 --steps 256

echo
echo "== a GRPO-style group: 4 samples of one prompt, T=0.8, top-p 0.9, seed 7, 2 threads =="
"$bitroll" generate --model "$model" "${targs[@]}" --prompt "Lily wanted a dog" -n 4 \
  --temperature 0.8 --top-p 0.9 --seed 7 --max-tokens 60 --threads "$(nproc)"

echo
echo "== reproducibility: the same group alone vs inside a batch of 16 other prompts, 1 vs $(nproc) threads =="
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf '"Lily wanted a dog"\n' > "$tmp/one.jsonl"
{ printf '"Lily wanted a dog"\n'; for i in $(seq 1 16); do printf '"Tom had %d apples"\n' "$i"; done; } > "$tmp/many.jsonl"
"$bitroll" generate --model "$model" "${targs[@]}" --prompts "$tmp/one.jsonl" -n 4 \
  --temperature 0.8 --top-p 0.9 --seed 7 --max-tokens 60 --threads 1 --json 2>/dev/null \
  | /usr/bin/env python3 -c 'import json,sys; [print(json.dumps([j["ids"], j["logprob_bits"]])) for j in map(json.loads, sys.stdin) if j["prompt_index"] == 0]' > "$tmp/a"
"$bitroll" generate --model "$model" "${targs[@]}" --prompts "$tmp/many.jsonl" -n 4 \
  --temperature 0.8 --top-p 0.9 --seed 7 --max-tokens 60 --threads "$(nproc)" --max-step-tokens 37 --json 2>/dev/null \
  | tee "$tmp/records.jsonl" | /usr/bin/env python3 -c 'import json,sys; [print(json.dumps([j["ids"], j["logprob_bits"]])) for j in map(json.loads, sys.stdin) if j["prompt_index"] == 0]' > "$tmp/b"
if cmp -s "$tmp/a" "$tmp/b"; then
  echo "identical: 4 trajectories, ids and fp32 logprob bits ($(wc -c < "$tmp/a") bytes compared)"
else
  echo "MISMATCH: batch composition changed a trajectory" >&2
  exit 1
fi

echo
echo "== the service: bitroll serve with 2 replicas; a GRPO-style loop from the Python client =="
"$bitroll" serve --model "$model" "${targs[@]}" --replicas 2 --bind 'tcp://127.0.0.1:*' \
  --price-replica-hour 2.50 --log-level warn > "$tmp/serve.out" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
endpoint=""
for _ in $(seq 1 100); do
  endpoint="$(awk '/clients/ {print $NF; exit}' "$tmp/serve.out" 2>/dev/null || true)"
  [ -n "$endpoint" ] && break
  kill -0 "$serve_pid" 2>/dev/null || { echo "bitroll serve exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$endpoint" ] || { echo "bitroll serve did not start" >&2; exit 1; }
# A llama2.c checkpoint: the loop also streams its (toy) updated policy as the next weights version.
policy_args=()
case "$model" in *.bin) policy_args=(--policy "$model") ;; esac
/usr/bin/python3 "$root/examples/python/grpo_loop.py" --endpoint "$endpoint" --text \
  --iterations 2 --groups 3 --n 8 --max-tokens 48 --temperature 1.0 --top-p 0.9 \
  --dump "$tmp/trajectories.jsonl" "${policy_args[@]}"
echo
echo "== multi-turn rollouts with a tool: the model's text between \" was\" and \".\" is a call to echo =="
/usr/bin/python3 "$root/examples/python/tool_rollout.py" --endpoint "$endpoint" --n 4
echo
echo "== a trainer streams new weights: random weights become stories260K, tensor by tensor =="
BITROLL_MODELS_DIR="${BITROLL_MODELS_DIR:-$root/../shared/models}" /usr/bin/python3 "$root/examples/python/stream_weights.py" \
  --bitroll "$bitroll" --self-test
echo
echo "== bitroll cost: what every trajectory cost (price: \$2.50 per replica-hour) =="
"$bitroll" cost "$tmp/trajectories.jsonl" --price-replica-hour 2.50 > "$tmp/cost.txt"
sed -n '1,12p' "$tmp/cost.txt"
echo "   ..."
awk '/per group/,0' "$tmp/cost.txt"
echo
echo "== bitroll audit: the 68 trajectories generated above, re-scored (one prefill each) and re-run =="
"$bitroll" audit "$tmp/records.jsonl" --model "$model" "${targs[@]}" 2>/dev/null | tail -n 1
"$bitroll" audit "$tmp/records.jsonl" --model "$model" "${targs[@]}" --mode rerun 2>/dev/null | tail -n 1
echo "-- the same records with one logprob bit flipped (trajectory 5):"
/usr/bin/env python3 -c 'import json,sys
for k, line in enumerate(sys.stdin):
    j = json.loads(line)
    t = min(9, len(j["logprob_bits"]) - 1)
    if k == 5: j["logprob_bits"][t] = "%08x" % (int(j["logprob_bits"][t], 16) ^ 1)
    print(json.dumps(j))' < "$tmp/records.jsonl" > "$tmp/tampered.jsonl"
rc=0
"$bitroll" audit "$tmp/tampered.jsonl" --model "$model" "${targs[@]}" > "$tmp/audit.txt" 2>/dev/null || rc=$?
grep -m1 ' diverged ' "$tmp/audit.txt" | sed 's/^ *//'
if [ "$rc" -ne 1 ]; then
  echo "audit: exit status $rc for a tampered record, want 1" >&2
  exit 1
fi
echo "exit status 1: a divergence (0: all identical, 2: could not audit)"
