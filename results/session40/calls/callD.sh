#!/usr/bin/env bash
# Session 40, call D: main's tests with the masked routing's whole masked tokens (torch bitwise and
# routing split at 1 / 2 / 4 processes, nvshmem bitwise at 1-8 PEs: tokens that go to no rank), then
# next/counted's routed timeline test and timeline (the expert-major chunks' count against place).
# Run with MAIN=<main's tree> CNT=<next/counted's tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CNT:?set CNT}
. "$R/results/session34/calls/next_lib.sh"  # s, tt, tn, tl, need_trees
need_trees $M $C
tt $M tm 180 'bitwise_equal or routing_split'
tn $M n 150 'bitwise'
[ $SECONDS -lt 470 ] && tt $C tc 60 'routed_kernel_s_timeline'
[ $SECONDS -lt 520 ] && tl $C lc
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
