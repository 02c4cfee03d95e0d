#!/usr/bin/env bash
# Prepared in session 38 (not run): results/session38/patches/count-before-loads.patch on main (the
# W=1 expert-major routed kernel's blocks that route no chunk count their share of the pairs into
# RouteScratch::sums before their round 0 loads, so the plan's totals need no chunk). Trees:
#   git checkout -b next/count main && git am results/session38/patches/count-before-loads.patch
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/count; cp results/session38/calls/next_call*.sh trees/
# run with MAIN=<main's tree> COUNT=<its tree>: torch tests of the routed kernel (four routings on
# one buffer each: a sum left unzeroed doubles the next rows), nvshmem's one-PE routed / bad-input
# tests, benches K / M / K / M (torch + nvshmem), then its timeline ("route chunk" of the rows
# >= 64 is now their count).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${COUNT:?set COUNT}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn
tt $T tt 100 'routes_inside or routed_kernel or alone_bad'
tn $T n 80 'one_pe_bad or one_pe_dispatch_routes'
b $T k1; b $M m1; b $T k2
[ $SECONDS -lt 400 ] && b $M m2
[ $SECONDS -lt 420 ] && tl $T lt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
