#!/usr/bin/env bash
# Session 51 call A: next/pdl-routed (the W=1 routed kernels as following launches) against main.
# Its torch tests (the new inputs-written-right-before test, the routing inside both layouts,
# bad ids, the rank-major repair, the timeline build, steal at 132), then W=1 torch push
# benches change / main / probe, twice round while the call has time (PROBE: next/chunk128 on
# the change, the routed kernels' chunks of 128 tokens).
#   MAIN=<main tree> CHANGE=<branch tree> PROBE=<probe tree> LIMIT=<s> bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}; P=${PROBE:?set PROBE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C $P
L=${LIMIT:-560}
tt $C tc 150 'reads_its_inputs or routes_inside or alone_bad or shifts or worst_outputs_are_final or timeline_build or (steal and 132)'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C c1 torch; b $M m1 torch
[ $SECONDS -lt $((L - 130)) ] && b $P k1 torch
[ $SECONDS -lt $((L - 90)) ] && b $C c2 torch
[ $SECONDS -lt $((L - 50)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 50)) ] && b $P k2 torch
ls=$(for l in c1 m1 k1 c2 m2 k2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
tail -30 $O/compare.txt
