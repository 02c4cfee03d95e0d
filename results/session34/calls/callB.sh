#!/usr/bin/env bash
# session 34, call B: next/fan-routed (b18f193: the W=1 expert-major dispatch routes inside its fan-out kernel)
# against main (00bdd77: next/fan-marks merged). Trees: scripts/baseline_tree.sh next/fan-routed; ... main.
# torch W=1 tests (the new routes_inside test, alone, phases, bitwise/num_worst/cached at W=1, summary, routing
# chunks at W=1-2), benches fused/main/fused/main, then nvshmem (route_ticketed refactored) and nccl on the branch.
R=$PWD; O=$OUT; F=b18f193; M=00bdd77
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
s() { (echo "== $1"; cat /tmp/o/$2/summary.txt; grep -h '^PASSED\|^FAILED\|^ERROR' /tmp/l/$2/*tests.log /tmp/l/$2/pytest.log 2>/dev/null) >> $O/summaries.txt; }
cd $R/trees/$F && export SYMMOE_COMMIT=$F
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=210 FAULT_S=200 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or phases or (num_worst and 1-) or (bitwise_equal and 1-) or (cached and 1-) or summary or routing_split or many_steps'" scripts/gpu_check.sh build test 2>&1 | tail -2
s "torch fan-routed" t; echo "t=$SECONDS"
b $F fused1
b $M main1
b $F fused2
[ $SECONDS -lt 400 ] && b $M main2
cd $R/trees/$F
[ $SECONDS -lt 450 ] && { OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=90 FAULT_S=80 PYTEST_ARGS="-rA -k 'worst or bitwise'" scripts/gpu_check.sh nvshmem 2>&1 | tail -1; s "nvshmem fan-routed" n; echo "t=$SECONDS"; }
[ $SECONDS -lt 510 ] && { OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh nccl 2>&1 | tail -1; s "nccl fan-routed" c; echo "t=$SECONDS"; }
tar czf $O/logs.tar.gz -C /tmp/l .
