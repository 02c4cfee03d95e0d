#!/usr/bin/env bash
# Session 48 call M: the W=1 expert-major routed kernel with the rows past round 0 prefetched into
# L2 (evict-last) while the routing keeps the stores waiting: next/prefetch (the blocks that do
# not route issue it right after their round 0 loads) and next/prefetch-late (each warp once its
# round 0 row landed) against main. Stamped timelines (torch push) of main / prefetch / late,
# then benches prefetch / main / late, twice while time is left (torch push, W=1). Every JSON
# goes into jsons.tar.gz (the device tool returns few files).
#   MAIN=<main tree> PF=<next/prefetch tree> LATE=<next/prefetch-late tree> LIMIT=<s> bash trees/callM.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PF:?set PF}; Q=${LATE:?set LATE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $P $Q
L=${LIMIT:-560}
tl $M main; tl $P pf; tl $Q late
b $P p1 torch; b $M m1 torch; b $Q q1 torch
[ $SECONDS -lt $((L - 100)) ] && b $P p2 torch
[ $SECONDS -lt $((L - 65)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 30)) ] && b $Q q2 torch
ls=$(for l in p1 m1 q1 p2 m2 q2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
