#!/usr/bin/env bash
# Session 57 C: on main's code, the W=1 bad id and capacity test x4 (the one torch GPU test not run
# on 14fa3e7's kernels), two W=1 benches of torch push and nvshmem, then nccl's tests and bench.
#   bash scripts/baseline_tree.sh main; cp results/session57/calls/callC.sh trees/
#   MAIN=<main> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tt $M ta 90 'alone_bad'
b $M m1; b $M m2
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/n LOG=/tmp/l/n timeout ${NCCL_LIMIT:-150} scripts/gpu_check.sh nccl 2>&1 | tail -1
 cp /tmp/l/n/nccl_bench.json $O/ 2>/dev/null; s "nccl" n)
finish $M m1 m2
grep '^FAILED\|^ERROR\|pytest\|nccl' $O/summaries.txt
