#!/usr/bin/env bash
# session 32 call F: next/cuda-alone 0a022e4 (W=1 torch tests, nccl section, bench torch push) vs main 9be6f40 (bench torch push);
# then main's torch tests that E's time limit cut (7168 fan phases, small copy pieces)
R=$PWD; O=$OUT
cd $R/trees/0a022e4 && export SYMMOE_COMMIT=0a022e4
OUT=/tmp/o/a LOG=/tmp/l/a TEST_LIMIT_S=170 FAULT_S=160 PYTEST_ARGS="-k '(bitwise_equal and 1-) or (many_chunks and 1-) or dtypes or repeated or (cached and 1-) or (num_worst and 1-) or single_process or timeline or (summary and 1) or (phases and 256) or small_copy'" scripts/gpu_check.sh build test nccl 2>&1 | tail -3
cp /tmp/o/a/summary.txt $O/summary_alone.txt; cp /tmp/l/a/nccl_bench.json $O/nccl_bench_alone.json
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/ab LOG=/tmp/l/ab scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/ab/bench.json $O/bench_alone.json
cd $R/trees/9be6f40 && export SYMMOE_COMMIT=9be6f40
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/mb LOG=/tmp/l/mb scripts/gpu_check.sh build bench 2>&1 | tail -1
cp /tmp/l/mb/bench.json $O/bench_main.json
left=$((570 - SECONDS)); echo "left $left s"
if [ $left -gt 60 ]; then
OUT=/tmp/o/m LOG=/tmp/l/m TEST_LIMIT_S=$((left-15)) FAULT_S=$((left-25)) PYTEST_ARGS="-k '(phases and 7168) or small_copy'" scripts/gpu_check.sh test 2>&1 | tail -1
cp /tmp/o/m/summary.txt $O/summary_main_rest.txt
fi
tar czf $O/logs.tar.gz -C /tmp/l .
