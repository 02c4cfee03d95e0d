#!/usr/bin/env bash
# Prepared in session 39 (not run): next/spec (results/session39/patches/rank-speculative.patch on
# main): the W=1 rank-major routed kernel stores each row at once to row t and repairs after the
# routing's rank column says some token has no row. Trees:
#   git checkout -b next/spec main && git am results/session39/patches/rank-speculative.patch
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/spec; cp results/session39/calls/next_call*.sh trees/
# Run with MAIN=<main's tree> SPEC=<its tree> (not GROUPS or other bash variables): the torch
# tests of the routed kernel (the masked routing now has whole tokens masked, so the repair runs;
# steal runs each routing twice, so the meeting's counter must be zero again), nvshmem's one-PE
# routed tests, then benches S / M / S / M (torch + nvshmem) as time allows.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${SPEC:?set SPEC}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn, need_trees
need_trees $M $T
tt $T tt 170 'routes_inside or routed_kernel or alone_bad or steal or (bitwise_equal and 1-)'
tn $T n 80 'one_pe_bad or one_pe_dispatch_routes'
b $T s1; b $M m1
[ $SECONDS -lt 470 ] && b $T s2
[ $SECONDS -lt 510 ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
