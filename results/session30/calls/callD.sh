#!/usr/bin/env bash
# session 30 call D: main 4a9365e after merging next/route-one-pass
O=$OUT; export SYMMOE_COMMIT=4a9365e
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-k 'bad_expert or routing or (bitwise_equal and 7168 and 1-)'" scripts/gpu_check.sh build test nccl 2>&1 | tail -6
cp /tmp/o/t/summary.txt $O/tests_torch_nccl.txt; cp /tmp/l/t/nccl_bench.json $O/nccl_bench.json
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=110 FAULT_S=100 PYTEST_ARGS="-k 'bitwise or summary or bad'" scripts/gpu_check.sh nvshmem 2>&1 | tail -3
cp /tmp/o/n/summary.txt $O/tests_nvshmem.txt; tar czf $O/test_logs.tar.gz -C /tmp/l t n
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=pull,push BENCH_REPEATS=20 OUT=/tmp/o/b LOG=/tmp/l/b scripts/gpu_check.sh bench 2>&1 | tail -30
cp /tmp/l/b/bench.json $O/bench.json
