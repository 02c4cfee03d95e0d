#!/usr/bin/env bash
# session 35, call D (the session's last device time, ~430 s): next/chunk64 4efeb14 (the routed kernel's chunks of
# 64 tokens) and next/rows-own-chunk de73794 (on it: rank-major, each warp waits for its own token's chunk mark)
# against main 1e22449. torch W=1 tests on de73794, then torch-only benches RO / M / C64 / RO.
R=$PWD; O=$OUT; RO=de73794; C64=4efeb14; M=1e22449
. "$R/results/session34/calls/next_lib.sh"  # s
bt() { # tree label: build + bench W=1 torch push, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
cd $R/trees/$RO && export SYMMOE_COMMIT=$RO
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=100 FAULT_S=90 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or (num_worst and 1-) or (cached and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch rows-own-chunk" t; echo "t=$SECONDS"
bt $RO own1
[ $SECONDS -lt 250 ] && bt $M main1
[ $SECONDS -lt 300 ] && bt $C64 c64
[ $SECONDS -lt 335 ] && bt $RO own2
tar czf $O/logs.tar.gz -C /tmp/l t 2>/dev/null
