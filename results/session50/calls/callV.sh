#!/usr/bin/env bash
# Session 50 call V: stamped timelines of next/warp 1987f1c's W=1 expert-major routed kernel
# (torch push) with kernel.fan_phases steal (its default), warp_l2 and warp, in one lease: the
# rounds after round 0 of each.
#   TREE=1987f1c bash trees/callV.sh
R=$PWD; O=$OUT; W=${TREE:?set TREE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $W
export TIMELINE_LAYOUTS=expert TIMELINE_VARIANTS="kernel.fan_phases=warp_l2 kernel.fan_phases=warp"
tl $W v
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
