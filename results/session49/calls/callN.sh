#!/usr/bin/env bash
# Session 49 call N: next/local (every block of the W=1 expert-major routed kernel counts the ids
# itself: count_ids; no block waits on another's counts) against main. Its torch tests of the
# routed kernels first (expert-major routing inside at 2 / 4 / 132 blocks, the steal, the
# timeline build, W=1 bad id and capacity), stamped timelines of local / main (torch push), then
# benches local / main / local / main (torch push W=1, 20 repeats) while time is left, nvshmem's
# one-PE routed tests on next/local last. Every JSON goes into jsons.tar.gz.
#   MAIN=<main tree> LOCAL=<next/local tree> LIMIT=<s> bash trees/callN.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${LOCAL:?set LOCAL}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $N
L=${LIMIT:-560}
tt $N tl 150 '(routes_inside and expert) or alone_bad or (steal and expert) or (timeline_build and expert)'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tl $N local; tl $M main
b $N l1 torch; b $M m1 torch
[ $SECONDS -lt $((L - 140)) ] && b $N l2 torch
[ $SECONDS -lt $((L - 100)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 70)) ] && tn $N n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
ls=$(for l in l1 m1 l2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
