#!/usr/bin/env bash
# session 33 call B: next/route-overlap 655c03a (torch W=1 + num_worst tests, nvshmem worst/bitwise, bench W=1),
# next/fan-evict 02f7435 (phases tests, bench W=1 twice), main be9d9d2 (bench twice), one lease
R=$PWD; O=$OUT
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
cd $R/trees/655c03a && export SYMMOE_COMMIT=655c03a
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=90 FAULT_S=85 PYTEST_ARGS="-k '1- or alone_bad or num_worst or (summary and 1)'" scripts/gpu_check.sh build test 2>&1 | tail -2
(echo "== torch overlap"; cat /tmp/o/t/summary.txt) >> $O/summaries.txt; echo "t=$SECONDS"
OUT=/tmp/o/nv LOG=/tmp/l/nv TEST_LIMIT_S=90 FAULT_S=85 PYTEST_ARGS="-k 'worst or bitwise'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1
(echo "== nvshmem overlap"; cat /tmp/o/nv/summary.txt) >> $O/summaries.txt; echo "t=$SECONDS"
b 655c03a overlap
cd $R/trees/02f7435 && export SYMMOE_COMMIT=02f7435
OUT=/tmp/o/te LOG=/tmp/l/te TEST_LIMIT_S=70 FAULT_S=65 PYTEST_ARGS="-k 'phases or (cached and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
(echo "== torch evict"; cat /tmp/o/te/summary.txt) >> $O/summaries.txt; echo "t=$SECONDS"
b 02f7435 evict1
b be9d9d2 main1
[ $SECONDS -lt 470 ] && b 02f7435 evict2
[ $SECONDS -lt 520 ] && b be9d9d2 main2
tar czf $O/logs.tar.gz -C /tmp/l .
