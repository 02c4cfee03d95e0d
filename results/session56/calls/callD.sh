#!/usr/bin/env bash
# Session 56 D: scripts/microbench/end_record.py twice, then the nvshmem tests C's limit cut.
#   MAIN=<main> bash trees/callD.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
mkdir -p /tmp/l/e
for i in 1 2; do
  timeout 60 python3 scripts/microbench/end_record.py 2>&1 | tee /tmp/l/e/end_record$i.txt
  (echo "== end_record $i"; cat /tmp/l/e/end_record$i.txt) >> $O/summaries.txt
done
echo "end_record t=$SECONDS"
tn $M nr ${NV_LIMIT:-200} '(one_pe_fan_out and 7168 and (grid or steal)) or one_pe_dispatch_routes or bad_expert_id_raises or receiver_over or one_pe_bad or absent or memory_peer'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
