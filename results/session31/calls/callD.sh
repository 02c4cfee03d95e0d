#!/usr/bin/env bash
# session 31 call D: next/pdl a14a646 (tests, bench) vs next/route-tail2 0c0876b (bench), W=1 torch push + nvshmem
R=$PWD; O=$OUT
cd $R/trees/a14a646 && export SYMMOE_COMMIT=a14a646
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=125 FAULT_S=115 PYTEST_ARGS="-k 'summary or (bad_expert and not worst) or cached or num_worst or (bitwise_equal and 1-) or (bitwise_equal and 2-256) or (streamed_push_is and 2-256)'" scripts/gpu_check.sh build test 2>&1 | tail -2
cp /tmp/o/t/summary.txt $O/tests_torch.txt
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/bb LOG=/tmp/l/bb scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/bb/bench.json $O/bench_pdl.json
cd $R/trees/0c0876b && export SYMMOE_COMMIT=0c0876b
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/bm LOG=/tmp/l/bm scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/bm/bench.json $O/bench_tail2.json; tar czf $O/logs.tar.gz -C /tmp/l t bb bm
cd $R/trees/a14a646 && export SYMMOE_COMMIT=a14a646
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=85 FAULT_S=80 PYTEST_ARGS="-k 'bitwise or summary or cached or (bad and not worst)'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
cp /tmp/o/n/summary.txt $O/tests_nvshmem.txt; tar czf $O/logs_n.tar.gz -C /tmp/l n
