#!/usr/bin/env bash
# session 31 call C: next/route-tail2 0c0876b (tests, bench) vs main 10d7b94 (bench), W=1 torch push + nvshmem
R=$PWD; O=$OUT
cd $R/trees/0c0876b && export SYMMOE_COMMIT=0c0876b
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=170 FAULT_S=160 PYTEST_ARGS="-k 'many_steps or many_chunks or summary or bad_expert or (bitwise_equal and (1- or 2-))'" scripts/gpu_check.sh build test 2>&1 | tail -3
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=100 FAULT_S=90 PYTEST_ARGS="-k 'bitwise or summary or bad'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
cat /tmp/o/t/summary.txt /tmp/o/n/summary.txt > $O/tests.txt
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/bb LOG=/tmp/l/bb scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/bb/bench.json $O/bench_branch.json
cd $R/trees/10d7b94 && export SYMMOE_COMMIT=10d7b94
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/bm LOG=/tmp/l/bm scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/bm/bench.json $O/bench_main.json; tar czf $O/logs.tar.gz -C /tmp/l t n bb bm
