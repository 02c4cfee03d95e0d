#!/usr/bin/env bash
# Session 41 C: next/host (next/pieces2's int32 pieces + the after-wait trims + the routed
# timeline's walked / scanned marks) against main. Trees:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/host; cp results/session41/calls/*.sh trees/
# Run with MAIN=<main's tree> HOST=<next/host's tree>: its routed timeline (where does a chunk's
# 4.5 µs count go: walk, scan, mark?), its torch tests of the host path it changed, nvshmem's,
# the host probe M / H, then benches H / M / H / M as time allows.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; H=${HOST:?set HOST}
. "$R/results/session34/calls/next_lib.sh"  # ab_benches, hp, tl, tt, tn, need_trees
need_trees $M $H
tl $H xt
tt $H tt 150 '((bitwise_equal or cached_dispatch_moves or num_worst_tokens_returns) and push) or timeline_build or leaves_the_host or bad_expert_id_raises or over_capacity'
tn $H n 120 'bitwise or cached or num_worst or one_pe_dispatch_routes'
hp $M hm; hp $H hh
ab_benches $H $M  # bench_c1 / m1 / c2 / m2.json
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
