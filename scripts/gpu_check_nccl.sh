#!/usr/bin/env bash
# nccl section of the GPU check (one GPU, world size 1): build, GPU tests, benchmark.
# Usage: scripts/gpu_check_nccl.sh OUT_DIR   (run from the repo root; nccl4py must be importable)
set -uo pipefail
out=${1:-/tmp/symmoe-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMOE_CACHE=${SYMMOE_CACHE:-/tmp/symmoe-cache}
rc=0
t0=$(date +%s)
python3 - <<'PY' 2>&1 | tee "$out/nccl_build.log" || rc=1
import time
from symmoe import build
import symmoe.backends.nccl as n
for name in ("symmoe_cuda", n.SPEC.name):
    t = time.time(); build.build(name); print(f"built {name} in {time.time() - t:.1f} s")
PY
python3 -m pytest -q -rs tests/gpu/test_nccl.py tests/test_nccl_build.py 2>&1 | tee "$out/nccl_tests.log" || rc=1
python3 scripts/bench_nccl.py --out "$out/nccl_bench.json" 2>&1 | tee "$out/nccl_bench.log" || rc=1
echo "nccl section: rc=$rc in $(( $(date +%s) - t0 )) s"
exit $rc
