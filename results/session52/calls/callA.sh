#!/usr/bin/env bash
# Session 52 call A: next/cluster-route (the W=1 routing on one cluster of 16 blocks, the data
# kernel following it) against main. Its torch tests (the new cluster test, the routing inside
# both layouts at 2/4/132 blocks, bad ids, the rank-major repair, the worst outputs, the timeline
# build, steal at 132, the phases at W=1 with 16 blocks), then W=1 torch push benches change /
# main twice round while the call has time, then nvshmem's one-PE tests if time is left.
#   MAIN=<main tree> CHANGE=<branch tree> LIMIT=<s> bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-560}
tt $C tc 200 'cluster or routes_inside or alone_bad or shifts or worst_outputs_are_final or timeline_build or (steal and 132) or fan_out_in_phases'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C c1 torch; b $M m1 torch
[ $SECONDS -lt $((L - 90)) ] && b $C c2 torch
[ $SECONDS -lt $((L - 50)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 100)) ] && tn $C tn $((L - SECONDS - 20)) 'one_pe or (bitwise and 1)'
ls=$(for l in c1 m1 c2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
tail -30 $O/compare.txt
