#!/usr/bin/env bash
# Session 46, call E: main after next/repair-early's merge (48eeedc), the tests call B did not run
# on it: the routed kernels' end word is also written by the expert-major alone_fan_routed_kernel
# (routes_inside expert, steal), and bitwise at W=1 (torch pull / push, hidden 256 / 7168).
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; cp results/session46/calls/callE.sh trees/
#   MAIN=<main's tree> bash trees/callE.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # tt, need_trees
need_trees $M
tt $M t 150 'routes_inside or steal or (bitwise_equal and 1-)'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
