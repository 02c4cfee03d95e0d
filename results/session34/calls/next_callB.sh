#!/usr/bin/env bash
# prepared in session 34 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/placed-all;
# scripts/baseline_tree.sh main; run with MAIN=<main's tree name>. (Rebase placed-all onto the winner of callA first.)
# next/placed-all 64b9dac: routing_placed waits one mark a thread. Tests, then benches placed-all / main twice.
R=$PWD; O=$OUT; PA=64b9dac; M=${MAIN:?set MAIN to the tree name of main}
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$PA && export SYMMOE_COMMIT=$PA
OUT=/tmp/o/p LOG=/tmp/l/p TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or (bitwise_equal and 1-) or (num_worst and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch placed-all" p; echo "t=$SECONDS"
b $PA placed1
b $M main1
[ $SECONDS -lt 480 ] && b $PA placed2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
