#!/usr/bin/env bash
# Session 50 call S: next/warp (kernel.fan_phases=warp / warp_l2) on one tree: its torch tests of
# the steal test at every phases mode (routed both layouts, cached, num_worst_tokens; 8 and 132
# blocks, twice in a row), then W=1 torch push benches with fan_phases steal / warp / warp_l2,
# twice round while the call has time, and bench_compare.
#   TREE=<next/warp tree> LIMIT=<s> bash trees/callS.sh
R=$PWD; O=$OUT; W=${TREE:?set TREE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $W
L=${LIMIT:-560}
bs() { # label phases: build + bench W=1 torch push, 20 repeats, kernel.fan_phases=<phases>
  (cd $R/trees/$W && SYMMOE_COMMIT=$W BENCH_SET="kernel.fan_phases=$2" BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch \
    BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/$1 LOG=/tmp/l/$1 scripts/gpu_check.sh build bench 2>&1 | tail -1
   cp /tmp/l/$1/bench.json $O/bench_$1.json); echo "$1 t=$SECONDS"; }
tt $W tw 170 'steal_hands'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
bs s1 steal; bs w1 warp; bs l1 warp_l2
[ $SECONDS -lt $((L - 120)) ] && bs s2 steal
[ $SECONDS -lt $((L - 80)) ] && bs w2 warp
[ $SECONDS -lt $((L - 40)) ] && bs l2 warp_l2
ls=$(for l in s1 w1 l1 s2 w2 l2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$W python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
