#!/usr/bin/env bash
# Prepared in session 37 (not run): results/session37/patches/tagged-chunk-counts.patch on main
# (the W=1 routed kernel's chunk counts tagged with their dispatch: no counted mark or fence, one
# read round; the routing's end takes sc.totals after the placed marks). Trees:
#   git checkout -b next/tagged main && git am results/session37/patches/tagged-chunk-counts.patch
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/tagged; cp results/session37/calls/next_call*.sh trees/
# run with MAIN=<main's tree> TAGGED=<its tree>: torch tests of the routed kernel on it, its timeline,
# torch + nvshmem benches T / M / T / M (nvshmem runs the same kernel through alone_routed).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${TAGGED:?set TAGGED}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $T tt 200 'routes_inside or routed_kernel or steal or alone_bad or (num_worst and 1-) or (bitwise_equal and 1-)'
tl $T lt
b $T t1; b $M m1
[ $SECONDS -lt 470 ] && b $T t2
[ $SECONDS -lt 530 ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
