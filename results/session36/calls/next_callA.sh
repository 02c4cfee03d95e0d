#!/usr/bin/env bash
# Prepared in session 36 for the next GPU session (not run): results/session36/patches/v4-loads-after-routing.patch,
# every block of the W=1 routed kernel issues round 0's loads after the whole routing is placed. Trees:
#   git checkout -b next/v4 main && git am results/session36/patches/v4-loads-after-routing.patch
#   rm -rf trees; scripts/baseline_tree.sh next/v4; scripts/baseline_tree.sh main; cp results/session36/calls/next_call*.sh trees/
# run with PATCHED=<v4's tree> MAIN=<main's tree>: torch tests of the routed kernel, its timeline (the routing's
# time without loads in flight: the `tables` and `planned` rows of "at"), torch benches P / M / P / M.
# next_callB.sh: nvshmem's one-PE tests and benches on both.
R=$PWD; O=$OUT; P=${PATCHED:?set PATCHED}; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # s
bt() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
(cd $R/trees/$P && SYMMOE_COMMIT=$P OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=200 FAULT_S=190 \
  PYTEST_ARGS="-rA -k 'routes_inside or routed_kernel or alone_bad or (num_worst and 1-) or (cached and 1-) or (bitwise_equal and 1-)'" \
  scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch v4" t; echo "t=$SECONDS"
(cd $R/trees/$P && SYMMOE_COMMIT=$P OUT=/tmp/o/l LOG=/tmp/l/l TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push \
  scripts/gpu_check.sh timeline 2>&1 | tail -1; cp /tmp/l/l/timeline.json $O/timeline_v4.json; cat /tmp/l/l/timeline.txt >> $O/summaries.txt)
bt $P p1; bt $M main1
[ $SECONDS -lt 480 ] && bt $P p2
[ $SECONDS -lt 530 ] && bt $M main2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
