#!/usr/bin/env bash
# Session 44, call C: next/rank-prefetch (alone_rows_routed_kernel loads the next token's ids and
# weights, and takes the token after next, while a row moves) against main (next/rank-mover
# merged). Its GPU tests (torch: the repair test, routes_inside / steal / timeline build rank-major,
# num_worst_tokens and cached at W=1; nvshmem: one-PE routed), then torch benches P / M / P / M.
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/rank-prefetch; cp results/session44/calls/callC.sh trees/
#   MAIN=<main's tree> PRE=<next/rank-prefetch's tree> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PRE:?set PRE}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $P
tt $P t 110 'rank_major_rows or (routes_inside and rank) or (routed_kernel_s_timeline and rank) or (steal and rank) or (num_worst and 1-) or (cached and 1-)'
tn $P n 50 'routes_inside'
b $P p1 torch; b $M m1 torch
[ $SECONDS -lt 400 ] && b $P p2 torch
[ $SECONDS -lt 440 ] && b $M m2 torch
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
