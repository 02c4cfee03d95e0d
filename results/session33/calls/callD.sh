#!/usr/bin/env bash
# session 33 call D: next/evict-more 1a14628 (torch bitwise W=1/2 tests, bench W=1 twice) against main 367345c
# (= 1a553af's code; bench twice), one lease
R=$PWD; O=$OUT
b() { # tree label: build + bench W=1 torch push + nvshmem, 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
cd $R/trees/1a14628 && export SYMMOE_COMMIT=1a14628
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=60 FAULT_S=55 PYTEST_ARGS="-rA -k '(bitwise_equal and (1- or 2-)) or back_to_back'" scripts/gpu_check.sh build test 2>&1 | tail -1
(echo "== torch evict-more"; cat /tmp/o/t/summary.txt; grep '^PASSED' /tmp/l/t/pytest.log) >> $O/summaries.txt; echo "t=$SECONDS"
b 1a14628 more1
b 367345c main1
[ $SECONDS -lt 380 ] && b 1a14628 more2
[ $SECONDS -lt 430 ] && b 367345c main2
tar czf $O/logs.tar.gz -C /tmp/l .
