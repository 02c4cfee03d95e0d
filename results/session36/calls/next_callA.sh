#!/usr/bin/env bash
# Prepared in session 36 for the next GPU session (not run). results/session36/patches, a series on main:
#   1-routed-rows-by-ticket: the routed kernel's stamped build keeps its rows in ticket order (row b: chunk b's
#     router, the last row the routing's end); timeline_probe.py --routed prints each row's marks. Its unstamped
#     kernels' PTX equals main's: tree R is main for the benches.
#   2-v4-loads-after-routing: every block issues round 0's loads after the whole routing is placed.
# Trees:
#   git checkout -b next/rows main && git am results/session36/patches/1-routed-rows-by-ticket.patch
#   git checkout -b next/v4 next/rows && git am results/session36/patches/2-v4-loads-after-routing.patch
#   rm -rf trees; scripts/baseline_tree.sh next/rows; scripts/baseline_tree.sh next/v4; cp results/session36/calls/next_call*.sh trees/
# run with ROWS=<R's tree> V4=<V's tree>: torch tests (V: the routed kernel, timelines, bitwise, worst, cached;
# R: the stamped builds), both routed timelines (which chunks route late, and the routing's time without
# loads in flight), torch benches V / R / V / R.
R=$PWD; O=$OUT; RT=${ROWS:?set ROWS}; V=${V4:?set V4}
. "$R/results/session34/calls/next_lib.sh"  # s, bt, tl
(cd $R/trees/$V && SYMMOE_COMMIT=$V OUT=/tmp/o/tv LOG=/tmp/l/tv TEST_LIMIT_S=200 FAULT_S=190 \
  PYTEST_ARGS="-rA -k 'routes_inside or routed_kernel or timeline or alone_bad or (num_worst and 1-) or (cached and 1-) or (bitwise_equal and 1-)'" \
  scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch V" tv; echo "t=$SECONDS"
tl $V lv
(cd $R/trees/$RT && SYMMOE_COMMIT=$RT OUT=/tmp/o/tr LOG=/tmp/l/tr TEST_LIMIT_S=100 FAULT_S=95 PYTEST_ARGS="-rA -k 'timeline'" \
  scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch R" tr; echo "t=$SECONDS"
tl $RT lr
bt $V v1; bt $RT r1
[ $SECONDS -lt 490 ] && bt $V v2
[ $SECONDS -lt 540 ] && bt $RT r2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
