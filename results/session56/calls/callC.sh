#!/usr/bin/env bash
# Session 56 C: scripts/microbench/end_record.py (an event recorded mid-kernel: how late does it
# complete?), then the rest of main's nvshmem suite and nccl's tests and bench at W=1.
#   MAIN=<main> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
mkdir -p /tmp/l/e
timeout 60 python3 scripts/microbench/end_record.py 2>&1 | tee /tmp/l/e/end_record.txt
(echo "== end_record"; cat /tmp/l/e/end_record.txt) >> $O/summaries.txt
echo "end_record t=$SECONDS"
tn $M nr ${NV_LIMIT:-200} 'not (bitwise or cached or num_worst or summary) or 1]'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/n LOG=/tmp/l/n timeout ${NCCL_LIMIT:-150} scripts/gpu_check.sh nccl 2>&1 | tail -1
 cp /tmp/l/n/nccl_bench.json $O/ 2>/dev/null; s "nccl" n)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep '^FAILED\|^ERROR\|pytest\|nccl' $O/summaries.txt
