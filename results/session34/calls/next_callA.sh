#!/usr/bin/env bash
# prepared in session 34 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/routed-timeline;
# scripts/baseline_tree.sh next/placed-all; scripts/baseline_tree.sh main; run with MAIN=<main's tree name>.
# 1. next/routed-timeline b512bb2: the stamped routed kernel's GPU test, then its timeline (where the expert dispatch
#    with routing spends the 11.5 µs the cached one does not: ticket, walk, sums, placed wait, round 0).
# 2. next/placed-all 6dc4dbe: routing_placed one mark a thread; tests, then benches placed-all / main twice.
R=$PWD; O=$OUT; RT=b512bb2; PA=6dc4dbe; M=${MAIN:?set MAIN to the tree name of main}
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
s() { (echo "== $1"; cat /tmp/o/$2/summary.txt; grep -h '^PASSED\|^FAILED\|^ERROR' /tmp/l/$2/*tests.log /tmp/l/$2/pytest.log 2>/dev/null) >> $O/summaries.txt; }
cd $R/trees/$RT && export SYMMOE_COMMIT=$RT
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=90 FAULT_S=80 PYTEST_ARGS="-rA -k 'routed_fan_out_s_timeline or (routes_inside and 7168)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch routed-timeline" t
OUT=/tmp/o/tl LOG=/tmp/l/tl TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push scripts/gpu_check.sh timeline 2>&1 | tail -1
cp /tmp/l/tl/timeline.json $O/timeline_routed.json; cat /tmp/l/tl/timeline.txt >> $O/summaries.txt; echo "t=$SECONDS"
cd $R/trees/$PA && export SYMMOE_COMMIT=$PA
OUT=/tmp/o/p LOG=/tmp/l/p TEST_LIMIT_S=120 FAULT_S=110 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or (bitwise_equal and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch placed-all" p; echo "t=$SECONDS"
b $PA placed1
b $M main1
[ $SECONDS -lt 500 ] && b $PA placed2
[ $SECONDS -lt 540 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
