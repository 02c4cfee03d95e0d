#!/usr/bin/env bash
# Session 39 call C: session 38's rank-groups patch rebased onto main without count-before-loads
# (next/gonly 52dbcc4: rank-major rows placed from the blocks' token-group counts; expert-major
# as main). Trees: scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/gonly.
# Run with MAIN=<main's tree> GRP=<its tree> (not GROUPS: a bash variable that ignores assignment): torch tests of the routed kernel (incl. layouts
# alternating on one buffer), steal, bitwise at W=1; nvshmem's one-PE routed / bad-input tests;
# benches G / M / G / M; its timeline.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${GRP:?set GRP}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn
tt $T tt 120 'routes_inside or routed_kernel or alone_bad or steal or (bitwise_equal and 1-)'
tn $T n 60 'one_pe_bad or one_pe_dispatch_routes'
b $T g1; b $M m1; b $T g2
[ $SECONDS -lt 400 ] && b $M m2
[ $SECONDS -lt 420 ] && tl $T lt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
