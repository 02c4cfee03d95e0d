#!/usr/bin/env bash
# Session 36 call C: the routed kernel's round 0 loads against its routing. Trees (scripts/baseline_tree.sh):
# main 7d61149, V1 cf21b29 (routing blocks issue round 0's loads after their chunk), V2 8333c5c (every block
# takes its ticket before its loads). Per variant: torch tests of the routed kernel, its timeline, a torch bench.
R=$PWD; O=$OUT; M=${MAIN:?}; V1=${V1:?}; V2=${V2:?}
. "$R/results/session34/calls/next_lib.sh"  # s
bt() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
tl() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push \
    scripts/gpu_check.sh timeline 2>&1 | tail -1; cp /tmp/l/$2/timeline.json $O/timeline_$2.json; (echo "== timeline $2"; cat /tmp/l/$2/timeline.txt) >> $O/summaries.txt); echo "$2 t=$SECONDS"; }
tt() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TEST_LIMIT_S=120 FAULT_S=110 \
    PYTEST_ARGS="-rA -k 'routes_inside or (num_worst and 1-) or routed_kernel'" scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch tests $2" $2; echo "$2 t=$SECONDS"; }
tt $V1 tv1; tl $V1 lv1; bt $V1 v1a
tt $V2 tv2; tl $V2 lv2; bt $V2 v2a
bt $M main1
[ $SECONDS -lt 470 ] && bt $V1 v1b
[ $SECONDS -lt 520 ] && bt $V2 v2b
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
