#!/usr/bin/env bash
# Prepared in session 42: next/l2rows (a9e3a32 on main 0ec55d1: the kernels D ran at ce44263, a
# comment, and a microbenchmark case), kernel.l2_prefetch. First the microbenchmark: the
# block-phased fan-out with its later rows put in L2 beforehand against without (if that does not
# gain, the mechanism has no headroom and the rest only confirms it); then its GPU
# tests (never run), its routed timeline with the key off and on (do "later rounds" shorten?),
# benches off / on / off / on (torch, nvshmem) in one tree. Session 42 D got one torch pair only:
# expert dispatch kernel 146.2 / 146.9 device µs. Make it the default only if the expert
# dispatch's kernel gains in both pairs on both backends; else drop the branch. From main's
# working copy:
#   rm -rf trees; scripts/baseline_tree.sh next/l2rows; cp results/session42/calls/next_callA.sh trees/
#   L2=<its tree> bash trees/next_callA.sh
R=$PWD; O=$OUT; L=${L2:?set L2}
. "$R/results/session34/calls/next_lib.sh"  # b, tl, tt, tn, need_trees
need_trees $L
(cd $R/trees/$L && SYMMOE_COMMIT=$L OUT=/tmp/o/mi LOG=/tmp/l/mi timeout 120 scripts/gpu_check.sh micro 2>&1 | tail -1; cp /tmp/l/mi/micro.txt $O/ 2>/dev/null)
(echo "== micro"; grep -h "fan-out to\|block phases\|cudaMemset of the written" /tmp/l/mi/micro.txt) >> $O/summaries.txt
echo "mi t=$SECONDS"
tt $L tt 120 'l2_prefetch or routes_inside or (bitwise_equal and 1-)'
tn $L n 90 'one_pe_dispatch_routes'
TIMELINE_VARIANTS="kernel.l2_prefetch=true" tl $L lt
b $L off1
BENCH_SET="kernel.l2_prefetch=true" b $L on1
[ $SECONDS -lt 470 ] && b $L off2
[ $SECONDS -lt 510 ] && BENCH_SET="kernel.l2_prefetch=true" b $L on2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
