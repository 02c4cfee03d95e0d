#!/usr/bin/env bash
# nccl section of the GPU check (one GPU, world size 1): build, GPU tests, benchmark.
# Usage: scripts/gpu_check_nccl.sh OUT_DIR   (from the repo root, with nccl4py importable;
# scripts/gpu_check.sh nccl installs the carried wheels and calls this)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/symmoe-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMOE_CACHE=${SYMMOE_CACHE:-/tmp/symmoe-cache}
rc=0
t0=$SECONDS
python3 - <<'PY' 2>&1 | tee "$out/nccl_build.log" || rc=1
import time
from symmoe import build
import symmoe.backends.nccl as n
for name in ("symmoe_cuda", n.SPEC.name):
    t = time.time(); build.build(name); print(f"built {name} in {time.time() - t:.1f} s")
PY
timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} tests/gpu/test_nccl.py tests/test_nccl_build.py 2>&1 \
  | tee "$out/nccl_tests.log" || rc=1
SYMMOE_BENCH_COMMAND=${SYMMOE_BENCH_COMMAND:-"scripts/gpu_check_nccl.sh"} \
  python3 scripts/bench_nccl.py --out "$out/nccl_bench.json" 2>&1 | tee "$out/nccl_bench.log" || rc=1
echo "nccl section: rc=$rc in $((SECONDS - t0)) s"
exit $rc
