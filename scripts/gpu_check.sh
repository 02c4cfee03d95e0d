#!/usr/bin/env bash
# One run on the GPU machine: install the carried wheels and symmoe, start CUDA MPS, build
# the kernels, run the GPU tests, benchmarks and A/B runs; a short table is printed last.
#
#   scripts/gpu_check.sh [section ...]      default: build test bench
#   sections: build | test | test-quick | bench | bench-quick | deepep | layer | adapters | training | nccl | nvshmem | ab | timeline | lowlat | fp8 | tune
#   lowlat: the low-latency mode's GPU tests (tests/gpu/test_low_latency_gpu.py: W = 1, 2, 4 under MPS,
#   the CUDA graph replayed 1000 times) and its benchmark (symmoe.bench.low_latency: $LL_TOKENS (128)
#   tokens per rank at W = $LL_WORLD_SIZES (2,4), beside DeepEP V1's normal mode when deep_ep imports;
#   LL_SET='low_latency.num_sms=66' sets symmoe config values for it; it prints each op's phases from the
#   kernels' timer stamps after the timings, then each call's host time split by layer: --trace-host)
#   fp8: the FP8 dispatch tests on every backend (tests/gpu/test_fp8_gpu.py; DeepGEMM's grouped GEMM
#   on the outputs when "build" built it from DEEPGEMM_SRC, scripts/build_deepgemm.sh), then FP8 beside
#   bf16 dispatch in one run (symmoe.bench.deepep --fp8, DeepEP too when built; DEEPEP_ARGS as in deepep); DEEPEP_FP8=float32
#   adds the FP8 ops to the deepep section
#   deepep: symmoe beside DeepEP V1 (symmoe.bench.deepep) at W = $DEEPEP_WORLD_SIZES (2,4) ranks under MPS,
#   $DEEPEP_TOKENS (128,512,1024,4096,8192) tokens per rank; DeepEP is built by "build" from DEEPEP_SRC
#   (DEEPEP_ARGS="--trace-host 128 --trace-api 128": more symmoe.bench.deepep arguments)
#   (a DeepEP source tree, scripts/build_deepep.sh), else the section runs symmoe alone and says so
#   (setup and MPS always run; timeline: scripts/timeline_probe.py, each warp's phases in the kernels)
#   layer: symmoe.nn.MoELayer forward + backward (symmoe.bench.layer) over torch push/pull and nvshmem, beside DeepEP V1
#   (when built), the V1 shim and all_to_all_single, at W = $LAYER_WORLD_SIZES (2,4), $LAYER_TOKENS (4096) tokens per rank
#   tune: symmoe tune configs/$TUNE_CONFIG.yaml (torch) at W = $TUNE_WORLD_SIZE (2), $TUNE_TOKENS (512,4096) tokens
#   per rank; the best settings as YAML in the logs (tuned_<config>.yaml), every candidate in tune.json
#   adapters: the GPU tests of the Megatron-Core and TorchTitan adapters and of the layer bench (tests/gpu/test_adapters_gpu.py)
# Every log and JSON goes to $LOG (default /tmp/symmoe-gpu, emptied first); at the end $OUT receives at
# most 7 files: summary.txt, logs.tar.gz and the JSONs of the sections that ran. The device tool
# brings back 8 files over all of its $OUT, folders included: a call with several runs points
# OUT at /tmp and copies into the tool's $OUT only what it needs (files past the 8th are lost).
# One call stays inside the 10-minute limit with e.g. "build test nccl", then "nvshmem bench ab".
#   PYTEST_ARGS='-k pull' scripts/gpu_check.sh test      extra pytest arguments, for every pytest section;
#   PYTEST_ARGS_<SECTION> (e.g. PYTEST_ARGS_FP8, PYTEST_ARGS_TEST_QUICK) for that section alone, so one
#   call can run e.g. "build lowlat fp8 test" with a selection in each
#   A test still running after $FAULT_S seconds (default 240) dumps every thread's stack
#   into the log (pytest's faulthandler), so a hang leaves a trace, not silence. A pytest
#   section still running after $TEST_LIMIT_S seconds (default 420) gets SIGINT, and SIGKILL
#   30 s later (timeout signals its whole process group, the spawned ranks included: a rank
#   spinning inside a library call never sees SIGINT, and would keep the log pipe open), so
#   the summary and logs still come back inside the device tool's 10-minute limit.
#   SYMMOE_COMMIT=<hash>   the commit recorded in every JSON: write the hash into the command (on the device, git rev-parse reads a stale .git)
#   SYMMOE_TEST_SEED=N                    replay the GPU tests' routings of an earlier run (its summary names N)
#   BENCH_BACKENDS=torch,nvshmem,nccl BENCH_WORLD_SIZES=1,4 BENCH_PROTOCOLS=pull,push BENCH_REPEATS=30   bench choices
#   BENCH_SET='kernel.num_channels=32 kernel.num_sms=64'   config values for every bench run
#   BENCH_X_IN_BUFFER=no|yes|both   x built in Buffer.input_view (no publish copy); both: pull runs twice
#   MPS=off                          no MPS daemon (world size 1 runs only)
#   BENCH_CPU=2                      bench pinned to these CPUs (taskset -c; world size 1: ranks inherit it): is the
#                                    host's two-speed mode the core it lands on?
# Later backends add their own sections in the case statement below.
set -uo pipefail
cd "$(dirname "$0")/.."
SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(build test bench)
source scripts/gpu_env.sh
# The GPU tests' routings come from one seed per run (tests/conftest.py); pytest -q hides its
# header, so the summary names it: SYMMOE_TEST_SEED=N replays the run.
export SYMMOE_TEST_SEED=${SYMMOE_TEST_SEED:-$(( (RANDOM << 15 | RANDOM) ))}
# Here a GPU test that finds no GPU or an unusable backend fails instead of skipping (tests/conftest.py).
export SYMMOE_REQUIRE_GPU=1
note "test seed $SYMMOE_TEST_SEED (replay: SYMMOE_TEST_SEED=$SYMMOE_TEST_SEED)"

# -- MPS: several ranks on the one GPU run concurrently -------------------------------------
# MPS=off leaves it out (world size 1 only: e.g. to see whether the host's waits change without it).
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if [ "${MPS:-on}" = off ]; then
  note "MPS off (MPS=off)"
elif nvidia-cuda-mps-control -d; then
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  note "MPS started"
else
  note "MPS not started (ranks time-slice)"
fi

# A pytest section's extra arguments: PYTEST_ARGS_<SECTION> where set (even empty), else PYTEST_ARGS.
section_pytest_args() {
  local v="PYTEST_ARGS_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  echo "${!v-${PYTEST_ARGS:-}}"
}

# Rank processes of a test cut off by TEST_LIMIT_S may still spin on the GPU (under MPS they
# keep their SMs) and would slow every later measurement: kill them before going on.
reap_ranks() { pkill -9 -f 'multiprocessing.spawn' 2>/dev/null && note "killed leftover rank processes"; return 0; }

# A pytest section's summary line; pytest prints "N passed" when SIGINT stops it too, so a run
# cut by TEST_LIMIT_S (timeout's 124, or 137 after SIGKILL) says so.
pytest_note() {  # label log rc
  local cut=""
  { [ "$3" -eq 124 ] || [ "$3" -eq 137 ]; } && cut=" -- CUT by TEST_LIMIT_S=${TEST_LIMIT_S:-420} s: the tests after these did not run"
  note "pytest ($1): $(tail -1 "$2")$cut"
}

status=0
for s in "${SECTIONS[@]}"; do
  case "$s" in
    build)
      if [ -n "${DEEPEP_SRC:-}" ]; then  # DeepEP V1 beside symmoe's build: both compile at once
        ( scripts/build_deepep.sh "$DEEPEP_SRC" "$LOG/deep_ep" >"$LOG/deepep_build.log" 2>&1 ) & deepep_pid=$!
      fi
      if [ -n "${DEEPGEMM_SRC:-}" ]; then  # DeepGEMM for the FP8 test's grouped GEMM, also at once
        ( scripts/build_deepgemm.sh "$DEEPGEMM_SRC" "$LOG/deep_gemm" >"$LOG/deepgemm_build.log" 2>&1 ) & deepgemm_pid=$!
      fi
      build_kernels || status=1
      if [ -n "${DEEPEP_SRC:-}" ]; then
        if wait $deepep_pid; then note "DeepEP V1 built from $DEEPEP_SRC"; export PYTHONPATH=$LOG/deep_ep:$PYTHONPATH
        else note "DeepEP V1 build FAILED ($LOG/deepep_build.log)"; tail -20 "$LOG/deepep_build.log"; fi
      fi
      if [ -n "${DEEPGEMM_SRC:-}" ]; then  # its kernels compile at their first call, into DG_JIT_CACHE_DIR
        if wait $deepgemm_pid; then note "DeepGEMM built from $DEEPGEMM_SRC"
          export PYTHONPATH=$LOG/deep_gemm:$PYTHONPATH DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dg_jit}
        else note "DeepGEMM build FAILED ($LOG/deepgemm_build.log)"; tail -20 "$LOG/deepgemm_build.log"; fi
      fi ;;
    deepep)  # every ratio is DeepEP's whole-call time over symmoe's, measured in the same job
      python3 -c "import deep_ep" 2>/dev/null || note "deep_ep not importable: symmoe runs alone (set DEEPEP_SRC and run build first)"
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/gpu_check.sh deepep)"
      timeout ${DEEPEP_LIMIT_S:-400} python3 -m symmoe.bench.deepep --world-sizes "${DEEPEP_WORLD_SIZES:-2,4}" \
        --tokens "${DEEPEP_TOKENS:-128,512,1024,4096,8192}" --repeats "${BENCH_REPEATS:-30}" \
        --config torch-push=configs/torch.yaml,protocol=push --config torch-pull=configs/torch.yaml,protocol=pull \
        --config torch-push-20sms=configs/torch.yaml,protocol=push,kernel.num_sms=20 \
        --config nvshmem-push=configs/nvshmem.yaml --fp8 "${DEEPEP_FP8:-none}" ${DEEPEP_ARGS:-} \
        --json "$LOG/deepep.json" --md "$LOG/deepep.md" 2>&1 | grep -v -i "warn" | tee "$LOG/deepep.log"
      rc=${PIPESTATUS[0]}; note "deepep side by side exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    layer)  # ratios: DeepEP V1's time (all_to_all_single's without it) over each variant's, one job, one set of weights
      python3 -c "import deep_ep" 2>/dev/null || note "deep_ep not importable: the layer runs without DeepEP (set DEEPEP_SRC and run build first)"
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/gpu_check.sh layer)"
      timeout ${LAYER_LIMIT_S:-500} python3 -m symmoe.bench.layer --world-sizes "${LAYER_WORLD_SIZES:-2,4}" \
        --tokens "${LAYER_TOKENS:-4096}" --repeats "${LAYER_REPEATS:-10}" \
        --config torch-push=configs/torch.yaml,protocol=push --config torch-pull=configs/torch.yaml,protocol=pull \
        --config nvshmem-push=configs/nvshmem.yaml \
        --json "$LOG/layer.json" --md "$LOG/layer.md" 2>&1 | grep -v -i "warn" | tee "$LOG/layer.log"
      rc=${PIPESTATUS[0]}; note "layer bench exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    test|test-quick|adapters)
      sel=(tests/gpu/test_torch_backend.py)
      [ "$s" = test-quick ] && sel+=(-k "not 7168")
      what="torch backend"; plog="$LOG/pytest.log"
      [ "$s" = adapters ] && { sel=(tests/gpu/test_adapters_gpu.py); what=adapters; plog="$LOG/pytest_adapters.log"; }
      eval "extra=($(section_pytest_args "$s"))"  # keeps quoted -k expressions whole
      timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} "${sel[@]}" "${extra[@]}" 2>&1 | tee "$plog"
      rc=${PIPESTATUS[0]}
      pytest_note "$what" "$plog" "$rc"
      reap_ranks
      [ "$rc" -ne 0 ] && status=1 ;;
    bench|bench-quick)
      ws=${BENCH_WORLD_SIZES:-1,4}; rep=${BENCH_REPEATS:-30}; protos=${BENCH_PROTOCOLS:-pull,push}
      backends=${BENCH_BACKENDS:-torch,nvshmem,nccl}
      [ "$s" = bench-quick ] && { ws=1; rep=10; }
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/gpu_check.sh "$s")"
      sets=(); for kv in ${BENCH_SET:-}; do sets+=(--set "$kv"); done
      pin=(); [ -n "${BENCH_CPU:-}" ] && command -v taskset >/dev/null && pin=(taskset -c "$BENCH_CPU")
      ${pin[@]+"${pin[@]}"} python3 -m symmoe.bench --backends $backends --world-sizes $ws --protocols $protos --repeats $rep "${sets[@]}" \
        --x-in-buffer "${BENCH_X_IN_BUFFER:-no}" --json "$LOG/bench.json" \
        2>&1 | tee "$LOG/bench.log"
      rc=${PIPESTATUS[0]}
      note "bench exit $rc"
      [ "$rc" -ne 0 ] && status=1 ;;
    nccl)  # nccl backend (world size 1): its build, GPU tests and benchmark (scripts/gpu_check_nccl.sh)
      bash scripts/gpu_check_nccl.sh "$LOG"
      rc=$?
      note "nccl: $(grep -h -E '^[0-9]+ (passed|failed)|passed|failed' "$LOG/nccl_tests.log" | tail -1); exit $rc"
      [ "$rc" -ne 0 ] && status=1 ;;
    nvshmem)  # nvshmem backend: build, GPU tests at 1/2/4/8 PEs under MPS (its benchmark: bench)
      if ! python3 -c "import symmoe.protocol.nvshmem as n; n.load_extension()" >"$LOG/nvshmem_build.log" 2>&1; then
        note "nvshmem build FAILED"; tail -50 "$LOG/nvshmem_build.log"; status=1; continue
      fi
      eval "extra=($(section_pytest_args "$s"))"
      timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} tests/gpu/test_nvshmem.py "${extra[@]}" 2>&1 | tee "$LOG/nvshmem_tests.log"
      rc=${PIPESTATUS[0]}
      pytest_note nvshmem "$LOG/nvshmem_tests.log" "$rc"
      reap_ranks
      [ "$rc" -ne 0 ] && status=1 ;;
    training)  # training GPU tests, then the example's loss curves across backends (W=2,4 under MPS; nccl at W=1)
      eval "extra=($(section_pytest_args "$s"))"
      timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} tests/gpu/test_training_gpu.py "${extra[@]}" 2>&1 | tee "$LOG/training_tests.log"
      rc=${PIPESTATUS[0]}; pytest_note training "$LOG/training_tests.log" "$rc"; reap_ranks; [ "$rc" -ne 0 ] && status=1
      timeout ${TRAIN_LIMIT_S:-300} python3 scripts/train_compare.py --world-sizes "${TRAIN_WORLD_SIZES:-2,4}" --steps "${TRAIN_STEPS:-10}" \
        --run torch-push=backend=torch,protocol=push,torch.allow_overlapping_devices=true \
        --run torch-pull=backend=torch,protocol=pull,torch.allow_overlapping_devices=true \
        --run nvshmem=backend=nvshmem --json "$LOG/train_compare.json" 2>&1 | tee "$LOG/train_compare.log"
      rc=${PIPESTATUS[0]}; note "training example across backends: $(tail -1 "$LOG/train_compare.log")"; reap_ranks; [ "$rc" -ne 0 ] && status=1
      # nccl needs one GPU per rank: it joins the comparison at world size 1 only
      timeout ${TRAIN_LIMIT_S:-300} python3 scripts/train_compare.py --world-sizes 1 --steps "${TRAIN_STEPS:-10}" \
        --run torch-push=backend=torch,protocol=push --run nvshmem=backend=nvshmem --run nccl=backend=nccl \
        --json "$LOG/train_compare_w1.json" 2>&1 | tee "$LOG/train_compare_w1.log"
      rc=${PIPESTATUS[0]}; note "training example at W=1 with nccl: $(tail -1 "$LOG/train_compare_w1.log")"; reap_ranks; [ "$rc" -ne 0 ] && status=1 ;;
    ab)  # A/B: V1 vs V2 vs Mega at world size 1 (nccl needs one GPU per rank), torch push vs pull at 4 ranks
      symmoe ab configs/ab/v1_v2_mega.yaml --world-size 1 --repeats 20 --out "$LOG/ab_mega" --no-fallback 2>&1 | tee "$LOG/ab_mega.log"
      rc=${PIPESTATUS[0]}; note "ab v1_v2_mega (W=1): exit $rc"; [ "$rc" -ne 0 ] && status=1
      # the same with the host's launch work hidden (each call queued behind a 1 ms sleep, as bench times)
      symmoe ab configs/ab/v1_v2_mega.yaml --world-size 1 --repeats 20 --timing device --out "$LOG/ab_mega_device" \
        --no-fallback 2>&1 | tee "$LOG/ab_mega_device.log"
      rc=${PIPESTATUS[0]}; note "ab v1_v2_mega (W=1, timing device): exit $rc"; [ "$rc" -ne 0 ] && status=1
      symmoe ab configs/ab/push_vs_pull.yaml --world-size 4 --repeats 20 --out "$LOG/ab_pushpull" --no-fallback 2>&1 | tee "$LOG/ab_pushpull.log"
      rc=${PIPESTATUS[0]}; note "ab push_vs_pull (W=4, MPS): exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    timeline)  # W=1 cached dispatch, warp by warp: launch skew, prologue, copy loop, drain
      # TIMELINE_BACKENDS, TIMELINE_LAYOUTS; TIMELINE_VARIANTS="kernel.copy_depth=3 kernel.copy_bytes=7168": each again
      vargs=(); for v in ${TIMELINE_VARIANTS:-}; do vargs+=(--variant "$v"); done
      python3 scripts/timeline_probe.py --backends "${TIMELINE_BACKENDS:-torch,nccl}" --protocols "${BENCH_PROTOCOLS:-push,pull}" \
        --layouts "${TIMELINE_LAYOUTS:-rank,expert}" "${vargs[@]}" --json "$LOG/timeline.json" 2>&1 | tee "$LOG/timeline.txt"
      rc=${PIPESTATUS[0]}; note "timeline probe exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    tune)  # symmoe tune: the launch settings of configs/$TUNE_CONFIG (torch) that run fastest here, as YAML
      cfg=${TUNE_CONFIG:-torch}
      timeout ${TUNE_LIMIT_S:-400} symmoe tune "configs/$cfg.yaml" --world-size "${TUNE_WORLD_SIZE:-2}" \
        --tokens "${TUNE_TOKENS:-512,4096}" --repeats "${TUNE_REPEATS:-10}" --out "$LOG/tuned_$cfg.yaml" \
        --json "$LOG/tune.json" 2>&1 | grep -v -i "warn" | tee "$LOG/tune.log"
      rc=${PIPESTATUS[0]}; note "tune $cfg (W=${TUNE_WORLD_SIZE:-2}): exit $rc"; [ "$rc" -ne 0 ] && status=1
      reap_ranks ;;
    lowlat)  # low-latency mode: GPU tests, then its benchmark (beside DeepEP V1 normal mode if built)
      eval "extra=($(section_pytest_args "$s"))"
      timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} tests/gpu/test_low_latency_gpu.py "${extra[@]}" 2>&1 | tee "$LOG/lowlat_tests.log"
      rc=${PIPESTATUS[0]}
      pytest_note "low-latency" "$LOG/lowlat_tests.log" "$rc"
      reap_ranks
      [ "$rc" -ne 0 ] && status=1
      llsets=(); for kv in ${LL_SET:-}; do llsets+=(--set "$kv"); done  # e.g. LL_SET='low_latency.num_sms=66'
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/gpu_check.sh lowlat)"
      timeout ${LL_LIMIT_S:-240} python3 -m symmoe.bench.low_latency --world-sizes "${LL_WORLD_SIZES:-2,4}" ${llsets[@]+"${llsets[@]}"} \
        --tokens "${LL_TOKENS:-128}" --repeats "${BENCH_REPEATS:-50}" --trace-host --json "$LOG/lowlat.json" --md "$LOG/lowlat.md" \
        2>&1 | grep -v -i "warn" | tee "$LOG/lowlat.log"
      rc=${PIPESTATUS[0]}; note "low-latency bench exit $rc"; [ "$rc" -ne 0 ] && status=1
      reap_ranks ;;
    fp8)  # FP8 rows bitwise on every backend, then FP8 vs bf16 dispatch (and DeepEP's, when built) in one run
      eval "extra=($(section_pytest_args "$s"))"
      timeout -s INT -k 30 ${TEST_LIMIT_S:-420} python3 -m pytest -q -m gpu -rfEs -p no:cacheprovider -o faulthandler_timeout=${FAULT_S:-240} tests/gpu/test_fp8_gpu.py "${extra[@]}" 2>&1 | tee "$LOG/fp8_tests.log"
      rc=${PIPESTATUS[0]}
      pytest_note fp8 "$LOG/fp8_tests.log" "$rc"
      reap_ranks
      [ "$rc" -ne 0 ] && status=1
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/gpu_check.sh fp8)"
      timeout ${DEEPEP_LIMIT_S:-400} python3 -m symmoe.bench.deepep --fp8 "${FP8_SCALES:-float32}" \
        --world-sizes "${DEEPEP_WORLD_SIZES:-2}" --tokens "${DEEPEP_TOKENS:-512,4096}" --repeats "${BENCH_REPEATS:-30}" \
        --config torch-push=configs/torch.yaml,protocol=push --config torch-pull=configs/torch.yaml,protocol=pull ${DEEPEP_ARGS:-} \
        --json "$LOG/fp8_bench.json" --md "$LOG/fp8_bench.md" 2>&1 | grep -v -i "warn" | tee "$LOG/fp8_bench.log"
      rc=${PIPESTATUS[0]}; note "fp8 beside bf16 dispatch exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    *) echo "unknown section '$s'"; status=2 ;;
  esac
done

finish_run deepep.json deepep.md layer.json layer.md lowlat.json fp8_bench.json fp8_bench.md train_compare.json train_compare_w1.json tune.json bench.json nccl_bench.json ab_mega/results.json ab_pushpull/results.json timeline.json
exit $status
