#!/usr/bin/env bash
# Session 58 C: all of main's nvshmem GPU tests (1, 2, 4, 8 PEs under MPS), then a W=1 bench of
# torch push and nvshmem while the call has time.
#   MAIN=<main> bash trees/callC.sh   (trees/<main> from scripts/baseline_tree.sh main)
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tn $M nc ${NV_LIMIT:-380} "${NV_K:-not no_such_test}"
[ $SECONDS -lt ${BENCH_BEFORE:-430} ] && { b $M m1; finish $M m1; }
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
