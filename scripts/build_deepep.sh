#!/usr/bin/env bash
# Builds DeepEP V1's intranode kernels (the baseline of symmoe.bench.deepep) from a DeepEP source
# tree, without NVSHMEM, into a copy: scripts/build_deepep.sh SRC DEST. Then PYTHONPATH=DEST.
# DeepEP is never a dependency of symmoe; this only makes the side-by-side benchmark possible.
#   SRC: a DeepEP checkout (v1.2.1 was measured: `git archive v1.2.1` of deepseek-ai/DeepEP)
# Two changes to the copy's setup.py: the NVSHMEM build is never selected (an installed NVSHMEM
# wheel would select DeepEP's internode/low-latency build, which needs IBGDA), and nothing is
# compiled with -rdc=true (without NVSHMEM nothing is device-linked).
set -euo pipefail
src=${1:?usage: scripts/build_deepep.sh SRC DEST}
dest=${2:?usage: scripts/build_deepep.sh SRC DEST}
rm -rf "$dest" && mkdir -p "$dest" && cp -r "$src"/. "$dest"/
python3 - "$dest/setup.py" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
forced = "    disable_nvshmem = True  # symmoe: intranode kernels only\n    if not disable_nvshmem:\n"
if forced not in s:
    s = s.replace("    if not disable_nvshmem:\n", forced, 1)
s = s.replace("'-rdc=true', ", "")
if forced not in s or "-rdc=true" in s:
    sys.exit(f"{path}: not the setup.py this script knows (DeepEP v1.2.1's); patch it by hand")
open(path, "w").write(s)
PY
cd "$dest" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-12} python3 setup.py build_ext --inplace
