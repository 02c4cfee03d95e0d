#!/usr/bin/env bash
# One run on a machine with N GPUs, one process per GPU (torchrun; bench spawns its own),
# N = every visible GPU:
#   check      symmoe check: torch, nvshmem and nccl at world size N, each bitwise equal to
#              symmoe.reference (hence to each other) on every routing kind, both layouts,
#              and cached dispatch (handle=..., --cached); then again with x built in
#              Buffer.input_view (--x-in-buffer, without --cached)
#   ab         symmoe ab configs/ab/v1_v2_mega.yaml: V1 vs V2 vs Mega, DeepSeek-V3 shape
#              (AB_SPEC=configs/ab/push_modes.yaml: another spec, e.g. push unpack vs stream)
#   baselines  python -m symmoe.bench.baselines: P2P copy GB/s of every GPU pair, NCCL all-to-all
#              bus bandwidth (the NVLink ceiling), all_to_all_single dispatch/combine (what
#              a user without symmoe writes), torch.ops.symm_mem.all_to_all_vdev_2d
#   bench      python -m symmoe.bench: every backend at world size N with per-kernel times
#   deepep     python -m symmoe.bench.deepep: every backend beside DeepEP V1's intranode kernels at
#              W = N, 2 and 4 (those <= N), 128/512/4096/8192 tokens per rank (DEEPEP_SRC: a DeepEP
#              source tree, built first by scripts/build_deepep.sh; without it symmoe runs alone)
#   training   scripts/train_compare.py: examples/train_moe.py at W = N per backend, loss curves and
#              final weights compared bit for bit
# then, when bench.json and baselines.json exist, python -m symmoe.bench.targets (the goal table:
# ratio to the NVLink all-to-all ceiling, speedup vs all_to_all_single) and prints that
# table last. On one GPU it runs the same steps at world size 1.
#   scripts/multigpu_check.sh [step ...]      default: check ab baselines bench deepep training
#   SYMMOE_COMMIT=<hash>                      the commit recorded in the JSON files: write the hash into the command (on the device, git rev-parse reads a stale .git)
#   STEP_LIMIT_S=1200                         each torchrun step is interrupted after this
#   BENCH_BACKENDS=torch,nvshmem,nccl BENCH_PROTOCOLS=pull,push BENCH_REPEATS=20
#   BENCH_X_IN_BUFFER=no|yes|both             bench with x built in Buffer.input_view (no publish copy); both: pull runs twice
#   CHECK_CONFIGS="configs/nccl.yaml"         the configs `check` runs (default: torch, nvshmem, nccl)
#   CHECK_SET="--set protocol=push"           more config values for `check`
#   CHECK_X_IN_BUFFER=no                      skip check's second pass (x built in Buffer.input_view)
# $OUT receives at most 8 files: summary.txt, logs.tar.gz and the JSON / Markdown results.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(check ab baselines bench deepep training)
source scripts/gpu_env.sh

N=$(nvidia-smi -L | wc -l)
note "$N GPU(s): world size $N, one process per GPU"
nvidia-smi topo -m >"$LOG/topology.txt" 2>&1
# Each torchrun step gets SIGINT after $STEP_LIMIT_S seconds (SIGKILL to all its processes 30 s
# later), so the logs still come back.
run() {
  timeout -s INT -k 30 "${STEP_LIMIT_S:-1200}" \
    python3 -m torch.distributed.run --nproc-per-node "$N" --standalone "$@"
}
CHECK_SHAPE=(--set buffer.max_tokens_per_rank=512 --set kernel.timeout_s=60)
read -r -a CHECK_CONFIGS <<< "${CHECK_CONFIGS:-configs/torch.yaml configs/nvshmem.yaml configs/nccl.yaml}"

status=0
# Every extension compiled once, before any step: on a fresh machine the ranks of the first
# step would otherwise compile inside its time limit (every rank compiling at once can take
# longer than a step's limit).
if [ -n "${DEEPEP_SRC:-}" ]; then  # DeepEP V1 compiles beside symmoe's kernels
  ( scripts/build_deepep.sh "$DEEPEP_SRC" "$LOG/deep_ep" >"$LOG/deepep_build.log" 2>&1 ) & deepep_pid=$!
fi
build_kernels || status=1
if [ -n "${DEEPEP_SRC:-}" ]; then
  if wait $deepep_pid; then note "DeepEP V1 built from $DEEPEP_SRC"; export PYTHONPATH=$LOG/deep_ep:$PYTHONPATH
  else note "DeepEP V1 build FAILED ($LOG/deepep_build.log)"; tail -20 "$LOG/deepep_build.log"; fi
fi
for s in "${STEPS[@]}"; do
  case "$s" in
    check)
      run -m symmoe.cli check "${CHECK_CONFIGS[@]}" "${CHECK_SHAPE[@]}" ${CHECK_SET:-} --cached \
        2>&1 | tee "$LOG/check.log"
      rc=${PIPESTATUS[0]}; note "check (${CHECK_CONFIGS[*]} ${CHECK_SET:-} at W=$N): exit $rc"; [ "$rc" -ne 0 ] && status=1
      if [ "${CHECK_X_IN_BUFFER:-yes}" = yes ]; then
        # x built in Buffer.input_view (pull reads it in place): the same checks again
        run -m symmoe.cli check "${CHECK_CONFIGS[@]}" "${CHECK_SHAPE[@]}" ${CHECK_SET:-} --x-in-buffer \
          2>&1 | tee "$LOG/check_x_in_buffer.log"
        rc=${PIPESTATUS[0]}; note "check, x in buffer (W=$N): exit $rc"; [ "$rc" -ne 0 ] && status=1
      fi ;;
    ab)
      spec=${AB_SPEC:-configs/ab/v1_v2_mega.yaml}
      run -m symmoe.ab "$spec" --out "$LOG/ab" --no-fallback 2>&1 | tee "$LOG/ab.log"
      rc=${PIPESTATUS[0]}; note "ab $(basename "$spec" .yaml) (W=$N): exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    baselines)
      run -m symmoe.bench.baselines --json "$LOG/baselines.json" 2>&1 | tee "$LOG/baselines.log"
      rc=${PIPESTATUS[0]}; note "baselines (W=$N): exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    bench)
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/multigpu_check.sh bench)"
      python3 -m symmoe.bench --backends "${BENCH_BACKENDS:-torch,nvshmem,nccl}" --protocols "${BENCH_PROTOCOLS:-pull,push}" \
        --world-sizes "$N" --x-in-buffer "${BENCH_X_IN_BUFFER:-no}" \
        --repeats "${BENCH_REPEATS:-20}" --json "$LOG/bench.json" 2>&1 | tee "$LOG/bench.log"
      rc=${PIPESTATUS[0]}; note "bench (W=$N): exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    deepep)
      python3 -c "import deep_ep" 2>/dev/null || note "deep_ep not importable: symmoe runs alone (set DEEPEP_SRC)"
      ws=$(python3 -c "print(','.join(str(w) for w in sorted({$N, 2, 4}) if 2 <= w <= $N))")
      export SYMMOE_BENCH_COMMAND="$(bench_command scripts/multigpu_check.sh deepep)"
      timeout -s INT -k 30 "${STEP_LIMIT_S:-1200}" python3 -m symmoe.bench.deepep --world-sizes "${DEEPEP_WORLD_SIZES:-$ws}" \
        --tokens "${DEEPEP_TOKENS:-128,512,4096,8192}" --repeats "${BENCH_REPEATS:-20}" \
        --config torch-push=configs/torch.yaml,protocol=push --config torch-pull=configs/torch.yaml,protocol=pull \
        --config torch-push-20sms=configs/torch.yaml,protocol=push,kernel.num_sms=20 \
        --config nvshmem=configs/nvshmem.yaml --config nccl=configs/nccl.yaml \
        --json "$LOG/deepep.json" --md "$LOG/deepep.md" 2>&1 | tee "$LOG/deepep.log"
      rc=${PIPESTATUS[0]}; note "deepep side by side (W=${DEEPEP_WORLD_SIZES:-$ws}): exit $rc"; [ "$rc" -ne 0 ] && status=1 ;;
    training)
      timeout -s INT -k 30 "${STEP_LIMIT_S:-1200}" python3 scripts/train_compare.py --world-sizes "$N" --steps "${TRAIN_STEPS:-10}" \
        --run torch-push=backend=torch,protocol=push --run torch-pull=backend=torch,protocol=pull \
        --run nvshmem=backend=nvshmem --run nccl=backend=nccl --json "$LOG/train_compare.json" 2>&1 | tee "$LOG/train_compare.log"
      rc=${PIPESTATUS[0]}; note "training example across backends (W=$N): $(tail -1 "$LOG/train_compare.log")"; [ "$rc" -ne 0 ] && status=1 ;;
    *) echo "unknown step '$s'"; status=2 ;;
  esac
done

# The target table needs the ceiling (baselines) and the backends (bench) of this run.
if [ -f "$LOG/bench.json" ] && [ -f "$LOG/baselines.json" ]; then
  AB_ARG=(); [ -f "$LOG/ab/results.json" ] && AB_ARG=(--ab "$LOG/ab/results.json")
  rm -f "$LOG/targets.md" "$LOG/targets.json"  # a failed run must not leave an older table behind
  python3 -m symmoe.bench.targets --bench "$LOG/bench.json" --baselines "$LOG/baselines.json" ${AB_ARG[@]+"${AB_ARG[@]}"} \
    --md "$LOG/targets.md" --json "$LOG/targets.json" >"$LOG/targets.log" 2>&1
  rc=$?; note "goal table: exit $rc"; [ "$rc" -ne 0 ] && { cat "$LOG/targets.log"; status=1; }
fi

[ -f "$LOG/ab/table.md" ] && sed -n '/^| variant | backend/,/^$/p' "$LOG/ab/table.md"
# check.log and the A/B results stay in logs.tar.gz: $OUT takes at most 8 files.
finish_run bench.json baselines.json deepep.json deepep.md train_compare.json targets.md
# The target table is the last thing on screen.
[ -f "$LOG/targets.md" ] && { echo; cat "$LOG/targets.md"; }
exit $status
