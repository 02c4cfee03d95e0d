#!/usr/bin/env bash
# session 32 call G: next/tail-follow be9d9d2 (torch W=1 worst-case tests, nvshmem 1-8 PEs, bench W=1 torch push + nvshmem)
# against main 9d9edf9 (bench), one lease
R=$PWD; O=$OUT
cd $R/trees/be9d9d2 && export SYMMOE_COMMIT=be9d9d2
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-k 'num_worst or (bitwise_equal and 1-) or (phases and 256) or (cached and 1-) or streamed_push_cached'" scripts/gpu_check.sh build test 2>&1 | tail -2
cp /tmp/o/t/summary.txt $O/summary_torch.txt; echo "t=$SECONDS"
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=130 FAULT_S=120 PYTEST_ARGS="-k 'bitwise or summary or worst or cached or (bad and not absent)'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
cp /tmp/o/n/summary.txt $O/summary_nvshmem.txt; echo "t=$SECONDS"
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/tb LOG=/tmp/l/tb scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/tb/bench.json $O/bench_tail.json; echo "t=$SECONDS"
cd $R/trees/9d9edf9 && export SYMMOE_COMMIT=9d9edf9
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/mb LOG=/tmp/l/mb scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/mb/bench.json $O/bench_main.json; echo "t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l .
