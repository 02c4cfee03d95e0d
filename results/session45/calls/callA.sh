#!/usr/bin/env bash
# Session 45, call A ran session 44's call B script unchanged (this copy): next/rank-coop (d1480bf) against main (54910d6).
# Session 44, call B: next/rank-mover (the W=1 rank-major dispatch that routes moves its rows with
# the mover to row t at once, alone_rows_repair_kernel behind it) against main. Its GPU tests
# (torch: the new repair test, routes_inside both layouts, steal, the routed timeline build,
# bitwise / cached / num_worst_tokens / bad ids at W=1; nvshmem: one-PE routed, bad id and
# capacity, bitwise at 1 PE), then benches change / main / change / main (torch, nvshmem push, W=1).
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/rank-mover; cp results/session44/calls/callB.sh trees/
#   MAIN=<main's tree> NEW=<next/rank-mover's tree> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $N
tt $N t 200 'rank_major_rows or routes_inside or routed_kernel_s_timeline or (num_worst and 1-) or (cached and 1-) or (bitwise_equal and 1-) or alone_bad or steal'
tn $N n 90 'routes_inside or one_pe_bad or (bitwise and not 2 and not 4 and not 8)'
b $N c1; b $M m1
[ $SECONDS -lt 470 ] && b $N c2
[ $SECONDS -lt 510 ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
