# Sourced by the GPU machine scripts (gpu_check.sh, multigpu_check.sh): environment, the
# carried nvshmem4py / nccl4py wheels, symmoe itself, and note() for the closing summary.
# Sets OUT (what the device tool brings back) and LOG (every log and JSON of the run).
OUT=${OUT:-$PWD/gpu_out}
LOG=${LOG:-/tmp/symmoe-gpu}
# A warm machine keeps /tmp between calls: an earlier call's bench.json left in LOG would be
# summarised as this call's. A LOG this script made (its marker file) starts empty; any other
# non-empty directory is refused rather than emptied.
if [ -n "$(ls -A "$LOG" 2>/dev/null)" ]; then
  if [ -f "$LOG/.symmoe-log" ]; then find "$LOG" -mindepth 1 -delete
  else echo "LOG=$LOG is not empty and was not made by gpu_env.sh: name an empty or new directory" >&2; exit 2; fi
fi
mkdir -p "$OUT" "$LOG" && touch "$LOG/.symmoe-log"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off everywhere (shared multi-GPU hosts), also in child processes.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMOE_CACHE=${SYMMOE_CACHE:-/tmp/symmoe-cache}
SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -m pip install -q -e . --no-deps --no-build-isolation >"$LOG/pip.log" 2>&1 || { cat "$LOG/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOG/device.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$LOG/device.txt"

# The command a results JSON records (SYMMOE_BENCH_COMMAND): the script and section, after the
# variables that chose the run (BENCH_*, MPS), so the JSON alone says how to reproduce it.
bench_command() {
  local v pre=""
  for v in BENCH_WORLD_SIZES BENCH_BACKENDS BENCH_PROTOCOLS BENCH_REPEATS BENCH_SET BENCH_X_IN_BUFFER BENCH_CPU MPS \
           LAYER_WORLD_SIZES LAYER_TOKENS LAYER_REPEATS DEEPEP_WORLD_SIZES DEEPEP_TOKENS DEEPEP_ARGS DEEPEP_FP8 \
           FP8_SCALES LL_WORLD_SIZES LL_TOKENS LL_SET; do
    [ -n "${!v:-}" ] && pre+="$v='${!v}' "
  done
  echo "${pre}$*"
}

# Every extension compiled (symmoe build), its log in $LOG/build.log; returns non-zero on failure.
build_kernels() {
  local t0=$SECONDS
  if python3 -m symmoe.cli build >"$LOG/build.log" 2>&1; then note "build ok ($((SECONDS - t0)) s)"
  else note "build FAILED"; tail -50 "$LOG/build.log"; return 1; fi
}

# The end of a run: the summary (and the benchmark table) printed last, then $OUT gets
# summary.txt, logs.tar.gz and each named file of $LOG that exists (a/b.json -> a_b.json).
finish_run() {
  echo
  echo "==================== summary ===================="
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  [ -f "$LOG/bench.json" ] && python3 -c "
import json
from symmoe.bench.gpu import table
print(table(json.load(open('$LOG/bench.json'))['results']))"
  for line in "${SUMMARY[@]}"; do echo "$line"; done > "$OUT/summary.txt"
  # The DeepEP and DeepGEMM builds stay out (their trees made the tarball too big to come back;
  # their build logs are files of their own).
  tar czf "$OUT/logs.tar.gz" --exclude=./deep_ep --exclude=./deep_gemm -C "$LOG" . 2>/dev/null
  for f in "$@"; do
    [ -f "$LOG/$f" ] && cp "$LOG/$f" "$OUT/$(echo "$f" | tr / _)"
  done
  return 0
}
