#!/usr/bin/env bash
# Session 36 call D: V3 (V1 plus polls of the routing chunks' marks that sleep kMarkPollNs = 256 ns between
# reads) and the same tree with 64 ns (trees/poll64): torch tests, timelines and benches; nvshmem's one-PE
# routed test on V3; main's bench last where time is left.
R=$PWD; O=$OUT; M=${MAIN:?}; V3=${V3:?}
. "$R/results/session34/calls/next_lib.sh"  # s
bt() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
tl() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push \
    scripts/gpu_check.sh timeline 2>&1 | tail -1; cp /tmp/l/$2/timeline.json $O/timeline_$2.json; (echo "== timeline $2"; cat /tmp/l/$2/timeline.txt) >> $O/summaries.txt); echo "$2 t=$SECONDS"; }
tt() { (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TEST_LIMIT_S=120 FAULT_S=110 \
    PYTEST_ARGS="-rA -k 'routes_inside or (num_worst and 1-) or routed_kernel'" scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch tests $2" $2; echo "$2 t=$SECONDS"; }
tt $V3 t3; tl $V3 l3; bt $V3 v3a
bt poll64 p64a; tl poll64 l64
[ $SECONDS -lt 340 ] && { (cd $R/trees/$V3 && SYMMOE_COMMIT=$V3 OUT=/tmp/o/n3 LOG=/tmp/l/n3 TEST_LIMIT_S=80 FAULT_S=75 \
    PYTEST_ARGS="-rA -k 'one_pe_dispatch_routes_inside'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1); s "nvshmem v3" n3; echo "n3 t=$SECONDS"; }
[ $SECONDS -lt 330 ] && bt $M main1
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
