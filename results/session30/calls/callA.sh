#!/usr/bin/env bash
# session 30 call A: next/route-tail (60b0aee) tests + bench A/B with main (42b3eea)
R=$PWD; O=$OUT; mkdir -p /tmp/o
cd $R/trees/60b0aee
SYMMOE_COMMIT=60b0aee OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-k 'routing or (bitwise_equal and 256) or bad_expert or worst or summary'" scripts/gpu_check.sh build test nccl 2>&1 | tail -25
SYMMOE_COMMIT=60b0aee OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=130 FAULT_S=120 PYTEST_ARGS="-k 'bitwise or summary or bad'" scripts/gpu_check.sh nvshmem 2>&1 | tail -8
B="BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20"
env $B SYMMOE_COMMIT=60b0aee OUT=/tmp/o/b1 LOG=/tmp/l/b1 scripts/gpu_check.sh bench 2>&1 | tail -3
cd $R && env $B SYMMOE_COMMIT=42b3eea OUT=/tmp/o/m1 LOG=/tmp/l/m1 scripts/gpu_check.sh build bench 2>&1 | tail -3
cd $R/trees/60b0aee && env $B SYMMOE_COMMIT=60b0aee OUT=/tmp/o/b2 LOG=/tmp/l/b2 scripts/gpu_check.sh build bench 2>&1 | tail -3
cd $R
cp /tmp/l/b1/bench.json $O/bench_b1.json; cp /tmp/l/m1/bench.json $O/bench_m1.json; cp /tmp/l/b2/bench.json $O/bench_b2.json
cat /tmp/o/t/summary.txt /tmp/o/n/summary.txt > $O/tests.txt
tar czf $O/logs.tar.gz -C /tmp/l t n
python3 -m symmoe.bench_compare $O/bench_m1.json $O/bench_b1.json $O/bench_b2.json --labels main,tail,tail2 | tee $O/compare.txt
