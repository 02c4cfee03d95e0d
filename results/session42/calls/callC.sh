#!/usr/bin/env bash
# Session 42 C: main's tests that have not run since 1037e98 (the int32 pieces, which the nccl
# backend's CUDA protocol shares): nccl's build, 15 GPU tests and its bench (last run session 39 A),
# the torch bad-id / receiver-over-capacity tests session 41 C's limit cut, nvshmem's bad id with
# num_worst_tokens; then one bench of main. From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; cp results/session42/calls/callC.sh trees/
#   MAIN=<main's tree> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tt, tn, need_trees
need_trees $M
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/nc LOG=/tmp/l/nc TEST_LIMIT_S=200 FAULT_S=190 \
  scripts/gpu_check.sh build nccl 2>&1 | tail -2; cp /tmp/l/nc/nccl_bench.json $O/ 2>/dev/null)
(echo "== nccl nc"; cat /tmp/o/nc/summary.txt; grep -h "passed\|failed\|FAILED\|ERROR" /tmp/l/nc/nccl_tests.log | tail -5; tail -15 /tmp/l/nc/nccl_bench.log) >> $O/summaries.txt
echo "nc t=$SECONDS"
tt $M tt 130 'receiver_over_capacity or bad_expert_id'
tn $M n 90 'bad_expert_id or num_worst_tokens'
[ $SECONDS -lt 430 ] && b $M m1
[ -f /tmp/o/m1/summary.txt ] && s "bench m1" m1
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
