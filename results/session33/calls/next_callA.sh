#!/usr/bin/env bash
# prepared in session 33 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/fan-marks,
# scripts/baseline_tree.sh next/fan-early, scripts/baseline_tree.sh main; run with MAIN=<main's tree name>.
# next/fan-marks 116af47 (= next/fan-early 81a89ad plus the stores on the placed marks): torch W=1 tests incl. the
# bad-id/capacity test in both layouts; bench W=1 fan-marks, fan-early, main (main also gives the first numbers of
# the like-for-like cached baseline), then fan-marks and main again, one lease.
R=$PWD; O=$OUT; FM=116af47; FE=81a89ad; M=${MAIN:?set MAIN to the tree name of main}
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
cd $R/trees/$FM && export SYMMOE_COMMIT=$FM
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-rA -k 'phases or alone_bad or (num_worst and 1-) or (bitwise_equal and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
(echo "== torch fan-marks"; cat /tmp/o/t/summary.txt; grep '^PASSED\|^FAILED' /tmp/l/t/pytest.log) >> $O/summaries.txt; echo "t=$SECONDS"
b $FM marks1
b $FE early1
b $M main1
[ $SECONDS -lt 480 ] && b $FM marks2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
