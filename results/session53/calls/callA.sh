#!/usr/bin/env bash
# Session 53 call A: the exact dispatch's host work after its wait without the slices that keep
# every row (320567a) against main before it (7ec258a; same kernels). The change's nvshmem one-PE
# tests (the merged route-first kernel's nvshmem path, not run in session 52) and its torch W=1
# bitwise tests, then W=1 torch push benches change / main twice round while the call has time.
#   MAIN=<main tree> CHANGE=<branch tree> LIMIT=<s> bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-540}
tn $C nc 110 'one_pe or bad_expert_id or (bitwise_equal and 1-)'
tt $C tc 90 '(bitwise_equal and 1-) or alone_bad'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
b $C c1 torch; b $M m1 torch
[ $SECONDS -lt $((L - 40)) ] && b $C c2 torch
[ $SECONDS -lt $((L - 40)) ] && b $M m2 torch
ls=$(for l in c1 m1 c2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -20 $O/compare.txt
