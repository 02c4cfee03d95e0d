#!/usr/bin/env bash
# session 32 call H: next/route-overlap 4919614 (torch W=1 tests, bench W=1 torch pull/push + nvshmem, nccl section)
# against main be9d9d2 (bench), one lease; then the W=4 MPS bench (torch pull/push, nvshmem) for the README
R=$PWD; O=$OUT
cd $R/trees/4919614 && export SYMMOE_COMMIT=4919614
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=120 FAULT_S=110 PYTEST_ARGS="-k '(bitwise_equal and 1-) or (many_chunks and 1-) or (cached and 1-) or (num_worst and 1-) or single_process or (summary and 1) or alone_bad or dtypes or repeated'" scripts/gpu_check.sh build test 2>&1 | tail -2
cp /tmp/o/t/summary.txt $O/summary_torch.txt; echo "t=$SECONDS"
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=pull,push BENCH_REPEATS=20 OUT=/tmp/o/tb LOG=/tmp/l/tb scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/tb/bench.json $O/bench_overlap.json; echo "t=$SECONDS"
cd $R/trees/be9d9d2 && export SYMMOE_COMMIT=be9d9d2
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/mb LOG=/tmp/l/mb scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/mb/bench.json $O/bench_main.json; echo "t=$SECONDS"
cd $R/trees/4919614 && export SYMMOE_COMMIT=4919614
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=60 FAULT_S=55 scripts/gpu_check.sh nccl 2>&1 | tail -1
cp /tmp/o/n/summary.txt $O/summary_nccl.txt; cp /tmp/l/n/nccl_bench.json $O/nccl_bench_overlap.json; echo "t=$SECONDS"
left=$((420 - SECONDS)); echo "left $left s"
if [ $left -gt 90 ]; then
  timeout -k 5 $((left - 5)) env BENCH_WORLD_SIZES=4 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=pull,push BENCH_REPEATS=10 OUT=/tmp/o/w4 LOG=/tmp/l/w4 scripts/gpu_check.sh bench 2>&1 | tail -1
  cp /tmp/l/w4/bench.json $O/bench_w4.json 2>/dev/null; echo "t=$SECONDS"
fi
tar czf $O/logs.tar.gz -C /tmp/l .
