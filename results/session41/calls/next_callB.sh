#!/usr/bin/env bash
# Prepared in session 41 (not run): next/prefetch (next/plan + the routing's ids and weights
# prefetched toward L2 by every block at the routed kernel's entry) against next/plan. Run after
# next_callA.sh, from main's working copy, with PLAN=<next/plan's tree> PF=<next/prefetch's tree>:
# its routed timeline (does the count walk, checked -> walked, drop from C's 2.8-4.3 µs?), its
# routed tests, benches F / P / F / P. Merge (after next/plan) if the tests pass and the expert
# dispatch's kernel gains in both pairs.
#   rm -rf trees; scripts/baseline_tree.sh next/plan; scripts/baseline_tree.sh next/prefetch; cp results/session41/calls/next_call*.sh trees/
R=$PWD; O=$OUT; P=${PLAN:?set PLAN}; F=${PF:?set PF}
. "$R/results/session34/calls/next_lib.sh"  # ab_benches, tl, tt, need_trees
need_trees $P $F
type ab_benches >/dev/null || { echo "next_lib.sh has no ab_benches: run from main's working copy" | tee -a $O/summaries.txt; exit 2; }
tl $F ft
tt $F tt 120 'routes_inside or routed_kernel or alone_bad or (bitwise_equal and 1-)'
ab_benches $F $P  # bench_c1 / m1 / c2 / m2.json
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
