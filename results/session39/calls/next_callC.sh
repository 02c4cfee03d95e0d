#!/usr/bin/env bash
# Prepared in session 39 (not run): main's nvshmem tests with the new masked routing (whole tokens
# masked: tokens that go to no PE; bitwise at 1-8 PEs) and the one-PE tests session 39 A's limit
# cut, then where the host's after-wait time goes on this machine (scripts/host_profile.py's
# after_wait_costs: the whole span and summarized_result alone, inside 200 real dispatches).
# Run with MAIN=<main's tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # s, tn, need_trees
need_trees $M
tn $M n 330 'bitwise or one_pe'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/h LOG=/tmp/l/h BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push \
  scripts/gpu_check.sh build host 2>&1 | tail -1; cp /tmp/l/h/host_profile.txt $O/host_profile.txt)
(echo "== host after-wait"; grep -A2 "after its counts wait" $O/host_profile.txt) >> $O/summaries.txt
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
