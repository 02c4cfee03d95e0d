#!/usr/bin/env bash
# session 33 call A: next/route-overlap 37b4a51 (torch W=1 + num_worst W=2/4 tests, nvshmem worst/bitwise, nccl,
# bench W=1 torch push + nvshmem) against main be9d9d2 (bench) in one lease; then probe/fan-evict-first's micro
R=$PWD; O=$OUT
cd $R/trees/37b4a51 && export SYMMOE_COMMIT=37b4a51
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=110 FAULT_S=100 PYTEST_ARGS="-k '1- or alone_bad or num_worst or (summary and 1)'" scripts/gpu_check.sh build test 2>&1 | tail -2
cp /tmp/o/t/summary.txt $O/summary_torch.txt; echo "t=$SECONDS"
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/tb LOG=/tmp/l/tb scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/tb/bench.json $O/bench_overlap.json; echo "t=$SECONDS"
OUT=/tmp/o/nv LOG=/tmp/l/nv TEST_LIMIT_S=100 FAULT_S=95 PYTEST_ARGS="-k 'worst or bitwise'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
cp /tmp/o/nv/summary.txt $O/summary_nvshmem.txt; echo "t=$SECONDS"
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=60 FAULT_S=55 scripts/gpu_check.sh nccl 2>&1 | tail -1
cp /tmp/o/n/summary.txt $O/summary_nccl.txt; echo "t=$SECONDS"
cd $R/trees/be9d9d2 && export SYMMOE_COMMIT=be9d9d2
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/mb LOG=/tmp/l/mb scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/mb/bench.json $O/bench_main.json; echo "t=$SECONDS"
cd $R/trees/e5d0861 && export SYMMOE_COMMIT=e5d0861
OUT=/tmp/o/mi LOG=/tmp/l/mi scripts/gpu_check.sh micro 2>&1 | tail -1
cp /tmp/l/mi/micro.txt $O/micro_evict.txt; echo "t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l .
