#!/usr/bin/env bash
# Installs symmoe (editable) and what it needs. Usage: scripts/install.sh [EXTRAS]
#   scripts/install.sh           the package
#   scripts/install.sh test      + pytest, the NCCL/NVSHMEM headers the kernel build test compiles against, megatron-core
# torch: an existing install is kept (GPU machines have a CUDA build); otherwise the CPU
# build 2.13.0 goes in first, so nothing pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[$extras]"
"$PY" -m pip install -q -e "$spec"
