#!/usr/bin/env bash
# Session 40, call F: where the exact dispatch's host time before its counts wait goes (host probe's
# before_wait_costs) and after it, torch and nvshmem push, W=1. Run with MAIN=<main's tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # need_trees
need_trees $M
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/h LOG=/tmp/l/h BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push \
  timeout 240 scripts/gpu_check.sh build host 2>&1 | tail -1; cp /tmp/l/h/host_profile.txt $O/host_profile.txt)
(echo "== host before / after the wait"; grep -A6 "before its counts wait" $O/host_profile.txt; grep -A2 "after its counts wait" $O/host_profile.txt) >> $O/summaries.txt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
