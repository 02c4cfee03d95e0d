#!/usr/bin/env bash
# Session 52 call C: next/route-first (exact-size W=1 rank-major: the routing blocks route with
# every warp first, so the counts reach the host early) against main. Its torch tests (the routing
# inside both layouts, the repair, bad ids, the worst outputs, the timeline build, W=1 bitwise),
# then W=1 torch push benches change / main twice round while the call has time.
#   MAIN=<main tree> CHANGE=<branch tree> LIMIT=<s> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-480}
tt $C tc 130 'routes_inside or shifts or alone_bad or worst_outputs_are_final or timeline_build or (bitwise_equal and 1-)'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C c1 torch; b $M m1 torch
[ $SECONDS -lt $((L - 40)) ] && b $C c2 torch
[ $SECONDS -lt $((L - 40)) ] && b $M m2 torch
ls=$(for l in c1 m1 c2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -12 $O/compare.txt
