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
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $V tv 200 'routes_inside or routed_kernel or timeline or alone_bad or (num_worst and 1-) or (cached and 1-) or (bitwise_equal and 1-)'
tl $V lv
tt $RT tr 100 'timeline'
tl $RT lr
b $V v1 torch; b $RT r1 torch
[ $SECONDS -lt 490 ] && b $V v2 torch
[ $SECONDS -lt 540 ] && b $RT r2 torch
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
