#!/usr/bin/env bash
# prepared in session 34 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/rows-routed;
# scripts/baseline_tree.sh main; run with MAIN=<main's tree name>.
# next/rows-routed b0a0673 = next/routed-timeline (the routed kernel's stamped instance, timeline_probe.py --routed)
# + the W=1 rank-major dispatch that routes through alone_fan_routed_kernel (rows in phases).
# 1. torch W=1 tests of both; 2. the routed kernel's timeline (expert-major; where the 11.5 µs over the cached
#    dispatch go); 3. benches rows-routed / main twice (rank dispatch and worst dispatch are the rows to watch).
R=$PWD; O=$OUT; RR=b0a0673; M=${MAIN:?set MAIN to the tree name of main}
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$RR && export SYMMOE_COMMIT=$RR
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=200 FAULT_S=190 PYTEST_ARGS="-rA -k 'routed_fan_out_s_timeline or routes_inside or alone_bad or (bitwise_equal and 1-) or (num_worst and 1-) or (cached and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch rows-routed" t; echo "t=$SECONDS"
OUT=/tmp/o/tl LOG=/tmp/l/tl TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push scripts/gpu_check.sh timeline 2>&1 | tail -1
cp /tmp/l/tl/timeline.json $O/timeline_routed.json; cat /tmp/l/tl/timeline.txt >> $O/summaries.txt; echo "t=$SECONDS"
b $RR rows1
b $M main1
[ $SECONDS -lt 480 ] && b $RR rows2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
