#!/usr/bin/env bash
# Session 42 D (last ~240 s of the session's device time): next/l2rows's kernel.l2_prefetch off /
# on / off / on in one tree, torch push W=1 benches only (no tests: the prefetch is a hint, its
# GPU tests are for the next session). From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh next/l2rows; cp results/session42/calls/callD.sh trees/
#   L2=<its tree> bash trees/callD.sh
R=$PWD; O=$OUT; L=${L2:?set L2}
. "$R/results/session34/calls/next_lib.sh"  # b, need_trees
need_trees $L
b $L off1 torch
BENCH_SET="kernel.l2_prefetch=true" b $L on1 torch
b $L off2 torch
BENCH_SET="kernel.l2_prefetch=true" b $L on2 torch
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
