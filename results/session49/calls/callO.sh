#!/usr/bin/env bash
# Session 49 call O: session 48's L2 probe (results/session48/calls/l2_keep.cu, before MPS starts),
# then next/pace (the W=1 expert-major routed kernel's round 0 loads paced: warp w's load waits
# for warp w - pace's to land; pace 4) and next/pace8 (pace 8) against main: their torch tests of
# the expert-major routing inside (2 / 4 / 132 blocks x hidden 64 / 7168), stamped timelines
# (torch push), then benches pace4 / main / pace8 / pace4 / main / pace8 while time is left.
#   MAIN=<main tree> P4=<next/pace tree> P8=<next/pace8 tree> LIMIT=<s> bash trees/callO.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${P4:?set P4}; Q=${P8:?set P8}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $P $Q
L=${LIMIT:-560}
(nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/l2_keep $R/results/session48/calls/l2_keep.cu && timeout 90 /tmp/l2_keep) > $O/l2_keep.txt 2>&1
echo "l2 t=$SECONDS"
tt $P tp 100 'routes_inside and expert'
tt $Q tq 100 'routes_inside and expert'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tl $P p4; tl $Q p8; tl $M main
b $P a1 torch; b $M m1 torch; b $Q b1 torch
[ $SECONDS -lt $((L - 100)) ] && b $P a2 torch
[ $SECONDS -lt $((L - 70)) ] && b $M m2 torch
[ $SECONDS -lt $((L - 40)) ] && b $Q b2 torch
ls=$(for l in a1 m1 b1 a2 m2 b2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
