#!/usr/bin/env bash
# Installs the Debian packages bitroll needs (when run as root), or prints the exact apt-get line.
# Idempotent: packages already present are not reinstalled. Used by test.sh and demo.sh.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev
  libzmq3-dev cppzmq-dev
  libflatbuffers-dev flatbuffers-compiler
  liblmdb-dev lmdb-utils
  libspdlog-dev libfmt-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libxxhash-dev
  libseccomp-dev bubblewrap
  prometheus-cpp-dev
  qemu-system-x86 busybox-static cpio
  iproute2 procps
  python3 python3-zmq python3-flatbuffers python3-numpy
  python3-pip python3-setuptools python3-venv
  # operations tests (tests/ops/): a single-host Slurm cluster, scripts/plot_cost.py's pictures
  slurm-wlm munge python3-matplotlib
  # bitroll.torch (python/ext, issue 15): the kernels module and the trainer tests/example
  pybind11-dev python3-dev python3-torch
  prometheus  # test only: the ops test scrapes `bitroll serve --metrics-bind` with it
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  echo "bitroll: installing missing packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
  echo "bitroll: missing Debian packages. Install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
