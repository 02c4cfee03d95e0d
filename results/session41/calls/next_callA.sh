#!/usr/bin/env bash
# Prepared in session 41 (not run): next/plan (87d98a9 on main 1037e98): the W=1 routed kernel's
# plan without two of its four L2 round trips in a row (release_sums at the block's end; no
# second error-word read). Session 41 C's timeline: chunk blocks built 7.7-10.5 µs -> planned
# 14.9-15.6, the others planned 10.8-12.3 after the last chunk counted at ~6.1. Trees, from main's
# working copy (its results/session34/calls/next_lib.sh has ab_benches; session 41 C ran from a
# branch whose copy had not, and its benches never ran):
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/plan; cp results/session41/calls/next_call*.sh trees/
# Run with MAIN=<main's tree> PLAN=<its tree>: its routed torch tests, nvshmem's one-PE routed
# tests, its routed timeline (planned earlier by 1-3 µs?), benches P / M / P / M. Merge if the
# tests pass and the expert dispatch's kernel (device µs) gains in both pairs.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PLAN:?set PLAN}
. "$R/results/session34/calls/next_lib.sh"  # ab_benches, tl, tt, tn, need_trees
need_trees $M $P
type ab_benches >/dev/null || { echo "next_lib.sh has no ab_benches: run from main's working copy" | tee -a $O/summaries.txt; exit 2; }
tt $P tt 150 'routes_inside or routed_kernel or alone_bad or steal or (bitwise_equal and 1-)'
tn $P n 70 'one_pe_bad or one_pe_dispatch_routes'
tl $P pt
ab_benches $P $M  # bench_c1 / m1 / c2 / m2.json
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
