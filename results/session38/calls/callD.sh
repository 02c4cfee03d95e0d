#!/usr/bin/env bash
# Session 38, call D: next/ready at 7a93807 (each routing chunk adds its counts into
# RouteScratch::sums; the expert-major plan is built once every chunk is counted, each token's row
# waits for its chunk's placed mark) against main (7bbd08b). Trees: scripts/baseline_tree.sh main;
# scripts/baseline_tree.sh next/ready; cp this into trees/. Run with MAIN=<main's tree> READY=<its tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${READY:?set READY}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $T tt 100 'routes_inside or routed_kernel or alone_bad'
(cd $R/trees/$T && SYMMOE_COMMIT=$T OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=80 FAULT_S=70 \
  PYTEST_ARGS="-rA -k 'one_pe_bad or one_pe_dispatch_routes'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem one-PE" n; echo "t=$SECONDS"
b $T r1; b $M m1; b $T r2
[ $SECONDS -lt 400 ] && b $M m2
[ $SECONDS -lt 420 ] && tl $T lt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
