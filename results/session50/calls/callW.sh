#!/usr/bin/env bash
# Session 50 call W: next/walk-l2 (kernel.fan_phases=steal_l2: the routed expert-major kernel's
# routing blocks read their round 0 rows into L2 once their ids are walked) on one tree: the
# steal test's expert-major cases at steal and steal_l2, then W=1 torch push benches steal /
# steal_l2 / steal / steal_l2 while the call has time, then the routed timelines of both.
#   TREE=<next/walk-l2 tree> LIMIT=<s> bash trees/callW.sh
R=$PWD; O=$OUT; W=${TREE:?set TREE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $W
L=${LIMIT:-380}
bs() { # label phases: build + bench W=1 torch push, 20 repeats, kernel.fan_phases=<phases>
  (cd $R/trees/$W && SYMMOE_COMMIT=$W BENCH_SET="kernel.fan_phases=$2" BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch \
    BENCH_PROTOCOLS=push BENCH_REPEATS=20 OUT=/tmp/o/$1 LOG=/tmp/l/$1 scripts/gpu_check.sh build bench 2>&1 | tail -1
   cp /tmp/l/$1/bench.json $O/bench_$1.json); echo "$1 t=$SECONDS"; }
tt $W tw 100 'steal_hands and expert'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
bs s1 steal; bs p1 steal_l2
[ $SECONDS -lt $((L - 70)) ] && bs s2 steal
[ $SECONDS -lt $((L - 35)) ] && bs p2 steal_l2
ls=$(for l in s1 p1 s2 p2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$W python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
[ $SECONDS -lt $((L - 30)) ] && (export TIMELINE_LAYOUTS=expert TIMELINE_VARIANTS="kernel.fan_phases=steal_l2"; tl $W v)
(cd $O && tar czf jsons.tar.gz bench_*.json && rm -f bench_*.json)
tar czf $O/logs.tar.gz -C /tmp/l 2>/dev/null .
