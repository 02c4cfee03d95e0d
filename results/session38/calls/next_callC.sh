#!/usr/bin/env bash
# Prepared in session 38 (not run): results/session38/patches/rank-groups.patch on top of
# count-before-loads.patch (the W=1 rank-major routed kernel: every block counts its token groups
# of 32 before its row loads; each row's place is the scan of those counts plus its group's ballot,
# so no row waits for a routing chunk). Trees:
#   git checkout -b next/count main && git am results/session38/patches/count-before-loads.patch
#   git checkout -b next/groups && git am results/session38/patches/rank-groups.patch
#   scripts/baseline_tree.sh next/groups (beside main's and next/count's); cp results/session38/calls/next_call*.sh trees/
# run with MAIN=<main's tree> GROUPS=<its tree>: the rank-major tests of the routed kernel (four
# routings on one buffer each, bad ids and capacity, cached and num_worst_tokens after it, the
# steal tests), nvshmem's one-PE routed / bad-input tests, benches G / M / G / M, its timeline.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${GROUPS:?set GROUPS}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn
tt $T tt 130 'routes_inside or routed_kernel or alone_bad or steal or (num_worst and 1-) or (bitwise_equal and 1-)'
tn $T n 80 'one_pe_bad or one_pe_dispatch_routes'
b $T g1; b $M m1; b $T g2
[ $SECONDS -lt 420 ] && b $M m2
[ $SECONDS -lt 440 ] && tl $T lt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
