#!/usr/bin/env bash
# Session 49 call P: main's four ranks on one H200 under MPS (torch push and nvshmem push, 10
# repeats: issue 4's aggregate over the copy roofline and its ratio to torch in the same run),
# then the nccl section (its GPU tests and W=1 bench) with the time left.
#   MAIN=<main tree> LIMIT=<s> bash trees/callP.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
L=${LIMIT:-440}
(cd $R/trees/$M && SYMMOE_COMMIT=$M BENCH_WORLD_SIZES=4 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push BENCH_REPEATS=10 \
  OUT=/tmp/o/w4 LOG=/tmp/l/w4 timeout 300 scripts/gpu_check.sh build bench 2>&1 | tail -1
 cp /tmp/l/w4/bench.json $O/bench_w4.json; cp /tmp/l/w4/targets*.md $O/ 2>/dev/null; (echo "== W=4 bench"; cat /tmp/o/w4/summary.txt) >> $O/summaries.txt)
echo "w4 t=$SECONDS"
[ $SECONDS -lt $((L - 120)) ] && (cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/nc LOG=/tmp/l/nc timeout $((L - SECONDS)) \
  scripts/gpu_check.sh nccl 2>&1 | tail -1; cp /tmp/l/nc/*.json $O/ 2>/dev/null; (echo "== nccl"; cat /tmp/o/nc/summary.txt; grep -h '^PASSED\|^FAILED\|^ERROR\|passed\|failed' /tmp/l/nc/nccl_tests.log) >> $O/summaries.txt)
echo "nccl t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
