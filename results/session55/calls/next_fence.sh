#!/usr/bin/env bash
# For session 56 (not run yet), only if next_probe.sh's "early" equals "sleep" (the late end record
# is not the exact call's last µs): is it the system-scope fence before the host's ready word
# (hand_counts, route.cuh), which the worst-size call skips? A probe tree, not a candidate: the
# fence made GPU-scope (`__threadfence()`), so the host may in principle read the matrix before
# the rest of it lands; bench timing only, no tests. Benches main / probe in turns, twice.
#   bash scripts/baseline_tree.sh main; T=trees/<main>; cp -r $T $T-gf
#   sed -i 's|    fence_sys();  // cumulative: every thread|    __threadfence();  // PROBE: every thread|' $T-gf/csrc/kernels/route.cuh
#   cp results/session55/calls/next_fence.sh trees/; MAIN=<main> PROBE=<main>-gf bash trees/next_fence.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PROBE:?set PROBE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $P
grep -q "PROBE: every thread" $R/trees/$P/csrc/kernels/route.cuh || { echo "no probe edit in trees/$P" | tee -a $O/summaries.txt; exit 2; }
b $P g1 torch; b $M m1 torch; b $P g2 torch; b $M m2 torch
finish $M g1 m1 g2 m2
