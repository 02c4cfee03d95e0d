#!/usr/bin/env bash
# For session 56 (not run yet): the rest of main's nvshmem suite (session 55 C ran 8 of 33), then
# nccl's tests and bench at W=1. Under 300 s of tests: a call the machine's owner takes back
# loses everything (session 55).
#   MAIN=<main tree> bash trees/next_tests.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tn $M nr ${NV_LIMIT:-240} 'not (bitwise or cached or num_worst or summary) or 1]'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/n LOG=/tmp/l/n timeout 200 scripts/gpu_check.sh nccl 2>&1 | tail -1
 cp /tmp/l/n/nccl_bench.json $O/ 2>/dev/null; s "nccl" n)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep '^FAILED\|^ERROR\|pytest\|nccl' $O/summaries.txt
