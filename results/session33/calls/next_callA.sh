#!/usr/bin/env bash
# prepared in session 33 for the next GPU session (not run): next/fan-early 02a01a4 (torch W=1 tests incl. the
# bad-id/capacity test in both layouts, bench W=1 twice) against main (bench twice: also the first numbers of the
# like-for-like cached baseline), one lease. Trees: scripts/baseline_tree.sh next/fan-early; scripts/baseline_tree.sh main
R=$PWD; O=$OUT; FE=02a01a4; M=${MAIN:?set MAIN to the short hash of main}
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
cd $R/trees/$FE && export SYMMOE_COMMIT=$FE
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-rA -k 'phases or alone_bad or (num_worst and 1-) or (bitwise_equal and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
(echo "== torch fan-early"; cat /tmp/o/t/summary.txt; grep '^PASSED' /tmp/l/t/pytest.log) >> $O/summaries.txt; echo "t=$SECONDS"
b $FE early1
b $M main1
[ $SECONDS -lt 440 ] && b $FE early2
[ $SECONDS -lt 500 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
