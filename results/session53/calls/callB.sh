#!/usr/bin/env bash
# Session 53 call B: the W=1 exact dispatch's result built before its counts wait (2fa7d50)
# against main before it (320567a; same kernels). The change's torch tests through the exact
# dispatch at W=1 and its nvshmem one-PE tests, then W=1 torch push benches change / main three
# times round while the call has time.
#   MAIN=<main tree> CHANGE=<branch tree> LIMIT=<s> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-560}
tt $C tc 120 '(bitwise_equal and 1-) or alone_bad or (cached_dispatch and 1-) or single_process or routes_inside or other_payload'
tn $C nc 90 'one_pe_dispatch_routes or one_pe_bad or (bitwise_equal and 1-)'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C g1 torch; b $M m1 torch
for i in 2 3; do
  [ $SECONDS -lt $((L - 35)) ] && b $C g$i torch
  [ $SECONDS -lt $((L - 35)) ] && b $M m$i torch
done
ls=$(for l in g1 m1 g2 m2 g3 m3; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -12 $O/compare.txt; grep -A4 "host after" $O/compare.txt
