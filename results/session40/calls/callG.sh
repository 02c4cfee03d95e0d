#!/usr/bin/env bash
# Session 40, call G: next/pieces (one int32 allocation for a dispatch's small state, the stream
# read once): torch tests at W=1 / 2, the host probe (before / after the wait; against call F's
# main), nvshmem tests. Run with PIECES=<its tree>.
R=$PWD; O=$OUT; P=${PIECES:?set PIECES}
. "$R/results/session34/calls/next_lib.sh"  # s, tt, tn, need_trees
need_trees $P
tt $P tp 60 '(bitwise_equal and (1- or 2-256)) or (cached_dispatch and 1-) or (num_worst and 1-) or alone_bad'
(cd $R/trees/$P && SYMMOE_COMMIT=$P OUT=/tmp/o/h LOG=/tmp/l/h BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push \
  timeout 60 scripts/gpu_check.sh build host 2>&1 | tail -1; cp /tmp/l/h/host_profile.txt $O/host_profile.txt)
(echo "== host before / after the wait"; grep -A6 "before its counts wait" $O/host_profile.txt; grep -A2 "after its counts wait" $O/host_profile.txt) >> $O/summaries.txt
echo "host t=$SECONDS"
[ $SECONDS -lt 150 ] && tn $P n $((190 - SECONDS)) 'bitwise or cached or one_pe_dispatch_routes'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
