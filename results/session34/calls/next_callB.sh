#!/usr/bin/env bash
# prepared in session 34 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/placed-all;
# scripts/baseline_tree.sh main; run with MAIN=<main's tree name>. (Rebase placed-all onto the winner of callA first.)
# next/placed-all 46d2cec: routing_placed waits one mark a thread. Tests, then benches placed-all / main twice.
R=$PWD; O=$OUT; PA=46d2cec; M=${MAIN:?set MAIN to the tree name of main}
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
s() { (echo "== $1"; cat /tmp/o/$2/summary.txt; grep -h '^PASSED\|^FAILED\|^ERROR' /tmp/l/$2/*tests.log /tmp/l/$2/pytest.log 2>/dev/null) >> $O/summaries.txt; }
cd $R/trees/$PA && export SYMMOE_COMMIT=$PA
OUT=/tmp/o/p LOG=/tmp/l/p TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or (bitwise_equal and 1-) or (num_worst and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch placed-all" p; echo "t=$SECONDS"
b $PA placed1
b $M main1
[ $SECONDS -lt 480 ] && b $PA placed2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
