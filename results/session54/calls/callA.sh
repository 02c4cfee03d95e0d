#!/usr/bin/env bash
# Session 54 call A: the wait that fills the guessed W=1 result in C++ (CountsWait) and the
# bench's host marks split after the timed calls (CHANGE) against the session's start (MAIN):
# the change's W=1 torch and one-PE nvshmem tests, then W=1 torch push benches c / m in turns.
#   MAIN=<base tree> CHANGE=<change tree> LIMIT=<s> bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-560}
tt $C tc 120 '(bitwise_equal and 1-) or alone_bad or (cached_dispatch and 1-) or single_process or routes_inside or other_payload'
tn $C nc 90 'one_pe_dispatch_routes or one_pe_bad'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C c1 torch; b $M m1 torch
for i in 2 3; do
  [ $SECONDS -lt $((L - 35)) ] && b $C c$i torch
  [ $SECONDS -lt $((L - 35)) ] && b $M m$i torch
done
ls=$(for l in c1 m1 c2 m2 c3 m3; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -12 $O/compare.txt; grep -A4 "host after" $O/compare.txt
