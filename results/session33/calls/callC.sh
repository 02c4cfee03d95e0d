#!/usr/bin/env bash
# session 33 call C: main 1a553af (both merges): torch W=1 + phases + num_worst tests, nvshmem worst/bitwise,
# the nccl section, bench W=1 torch pull/push + nvshmem
R=$PWD; O=$OUT; export SYMMOE_COMMIT=1a553af
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=170 FAULT_S=160 PYTEST_ARGS="-rA -k 'phases or 1- or alone_bad or num_worst or (summary and 1) or single_process'" scripts/gpu_check.sh build test 2>&1 | tail -2
(echo "== torch"; cat /tmp/o/t/summary.txt; grep -c '^PASSED' /tmp/l/t/pytest.log; grep '^PASSED.*phases' /tmp/l/t/pytest.log) >> $O/summaries.txt; echo "t=$SECONDS"
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=pull,push BENCH_REPEATS=20 OUT=/tmp/o/b LOG=/tmp/l/b scripts/gpu_check.sh bench 2>&1 | tail -1
cp /tmp/l/b/bench.json $O/bench_main.json; cp /tmp/l/b/targets_one_gpu.md $O/ 2>/dev/null; echo "t=$SECONDS"
OUT=/tmp/o/nv LOG=/tmp/l/nv TEST_LIMIT_S=90 FAULT_S=85 PYTEST_ARGS="-k 'worst or bitwise'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
(echo "== nvshmem"; cat /tmp/o/nv/summary.txt) >> $O/summaries.txt; echo "t=$SECONDS"
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=60 FAULT_S=55 scripts/gpu_check.sh nccl 2>&1 | tail -1
(echo "== nccl"; cat /tmp/o/n/summary.txt) >> $O/summaries.txt; cp /tmp/l/n/nccl_bench.json $O/nccl_bench.json; echo "t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l .
