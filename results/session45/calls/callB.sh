#!/usr/bin/env bash
# Session 45, call B: next/tail-early (the W=1 routed rank-major dispatch's repair kernel in blocks
# of 128 threads and letting the tail be scheduled before its own wait, so both are resident as
# the routed kernel ends) against main. Its GPU tests (torch: the repair test, num_worst_tokens,
# the routing inside rank-major, bad ids / capacity; nvshmem: one PE), then benches
# change / main / change / main (torch, nvshmem push, W=1).
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/tail-early; cp results/session45/calls/callB.sh trees/
#   MAIN=<main's tree> NEW=<next/tail-early's tree> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees, ab_benches
need_trees $M $N
tt $N t 150 'rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or (alone_bad and rank) or (bitwise_equal and 1-)'
tn $N n 80 'one_pe or (bitwise and not 2 and not 4 and not 8)'
ab_benches $N $M
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
