#!/usr/bin/env bash
# Prepared in session 40 (not run): next/late (results/session40/patches/late-loads.patch on main):
# expert-major, the W=1 routed kernel's blocks without a routing chunk issue their round-0 loads
# once every chunk is counted (RouteScratch::summed), so the chunks' count walks do not queue
# behind those bulk loads. Trees:
#   git checkout -b next/late main && git am results/session40/patches/late-loads.patch
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/late; cp results/session40/calls/next_call*.sh trees/
# Run with MAIN=<main's tree> LATE=<its tree> (not GROUPS or another bash variable): its torch
# tests of the routed kernel, nvshmem's one-PE routed tests, its routed timeline (does a chunk's
# count end near 2 µs instead of 5-6, and the plan near 6-8 instead of 11-15?), then benches
# L / M / L / M (torch + nvshmem) as time allows (ab_benches). Merge if the tests pass and the expert dispatch's
# kernel (device µs) gains in both pairs.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; L=${LATE:?set LATE}
. "$R/results/session34/calls/next_lib.sh"  # ab_benches, tl, tt, tn, need_trees
need_trees $M $L
tt $L tt 150 'routes_inside or routed_kernel or alone_bad or steal or (bitwise_equal and 1-)'
tn $L n 70 'one_pe_bad or one_pe_dispatch_routes'
tl $L lt
ab_benches $L $M  # bench_c1 / m1 / c2 / m2.json
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
