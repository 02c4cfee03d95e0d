#!/usr/bin/env bash
# Session 48 call L: the W=1 expert-major routed kernel, next/chain (round 0's routing read while
# the sums are awaited, the readers' count answered at the block's end, no second error-word
# read) and next/chain-load (that + the routing blocks' round 0 loads issued before their
# routing) against main. Their torch tests of the routed kernels and nvshmem's one-PE routed tests
# first; then the stamped timelines (torch push) of main / chain / chain-load; then benches
# chain / main / load / chain / main / load while time is left.
#   MAIN=<main tree> CHAIN=<next/chain tree> LOAD=<next/chain-load tree> LIMIT=<s> bash trees/callL.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHAIN:?set CHAIN}; D=${LOAD:?set LOAD}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C $D
L=${LIMIT:-560}
tt $C tc 120 'routes_inside or final_for_the_next_op or alone_bad'
tt $D td 120 'routes_inside and expert'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tn $C n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
tl $M main; tl $C chain; tl $D load
b $C c1 torch; b $M m1 torch; b $D l1 torch
[ $SECONDS -lt $((L - 100)) ] && b $C c2 torch
[ $SECONDS -lt $((L - 65)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 30)) ] && b $D l2 torch
ls=$(for l in c1 m1 l1 c2 m2 l2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
