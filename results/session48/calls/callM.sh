#!/usr/bin/env bash
# Session 48 call M: the W=1 expert-major routed kernel with the rows past round 0 prefetched into
# L2 (evict-last) while the routing keeps the stores waiting: next/prefetch (the blocks that do
# not route issue it right after their round 0 loads) and next/prefetch-late (each warp once its
# round 0 row landed) against main. Their torch tests of the expert-major routing inside first,
# stamped timelines (torch push) of main / prefetch / late, then benches prefetch / main / late /
# prefetch / main while time is left (torch push, W=1), nvshmem's one-PE routed tests on
# next/prefetch last. Every JSON goes into jsons.tar.gz (the device tool returns few files).
#   MAIN=<main tree> PF=<next/prefetch tree> LATE=<next/prefetch-late tree> LIMIT=<s> bash trees/callM.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PF:?set PF}; Q=${LATE:?set LATE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $P $Q
L=${LIMIT:-560}
tt $P tp 100 'routes_inside and expert'
tt $Q tq 100 'routes_inside and expert'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tl $M main; tl $P pf; tl $Q late
b $P p1 torch; b $M m1 torch; b $Q q1 torch
[ $SECONDS -lt $((L - 150)) ] && b $P p2 torch
[ $SECONDS -lt $((L - 120)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 80)) ] && tn $P n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
ls=$(for l in p1 m1 q1 p2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
