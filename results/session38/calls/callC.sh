#!/usr/bin/env bash
# Session 38, call C: next/ready (29ea669: the expert-major routed kernel builds its plan on the
# last chunk's totals mark and waits per token for its chunk's placed mark) against main (7bbd08b).
# Trees: scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/ready; cp this into trees/.
# Run with MAIN=<main's tree> READY=<its tree>: torch tests of the routed kernel, nvshmem's one-PE
# routed / bad-input tests, the routed timeline, then torch + nvshmem benches R / M / R / M.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${READY:?set READY}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $T tt 120 'routes_inside or routed_kernel or alone_bad'
(cd $R/trees/$T && SYMMOE_COMMIT=$T OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=90 FAULT_S=80 \
  PYTEST_ARGS="-rA -k 'one_pe_bad or one_pe_dispatch_routes'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem one-PE" n; echo "t=$SECONDS"
tl $T lt
b $T r1; b $M m1
[ $SECONDS -lt 480 ] && b $T r2
[ $SECONDS -lt 530 ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
