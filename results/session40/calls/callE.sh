#!/usr/bin/env bash
# Session 40, call E (warm after D): nvshmem's one-PE tests session 39 A's limit cut, with the masked
# routing's whole masked tokens; then the host probe's after-wait costs (torch, nvshmem push).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # s, tn, need_trees
need_trees $M
tn $M n2 200 'one_pe and not one_pe_bad and not one_pe_dispatch_routes'
if [ $SECONDS -lt 300 ]; then
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/h LOG=/tmp/l/h BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push \
  timeout 150 scripts/gpu_check.sh build host 2>&1 | tail -1; cp /tmp/l/h/host_profile.txt $O/host_profile.txt)
(echo "== host after-wait"; grep -A2 "after its counts wait" $O/host_profile.txt) >> $O/summaries.txt
fi
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
