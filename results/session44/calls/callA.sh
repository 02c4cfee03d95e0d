#!/usr/bin/env bash
# Session 44, call A: next/ab-timing (49007f7 = main aa28c10 + the ab-timing patch of session 43).
# First the nvshmem tests that cover main's 6198527 `_route` edit (multi-PE bitwise, the plan
# kernel, cached dispatch), then gpu_check's ab section (v1_v2_mega at W=1, timing call and
# device; push_vs_pull at W=4). From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh next/ab-timing; cp results/session44/calls/callA.sh trees/
#   ABT=<its tree> bash trees/callA.sh
R=$PWD; O=$OUT; T=${ABT:?set ABT}
. "$R/results/session34/calls/next_lib.sh"  # need_trees, tn
need_trees $T
tn $T nv 150 'bitwise or plan_kernel or cached'
(cd $R/trees/$T && SYMMOE_COMMIT=$T OUT=/tmp/o/ab LOG=/tmp/l/ab timeout $((560 - SECONDS)) scripts/gpu_check.sh build ab 2>&1 | tail -1)
for k in ab_mega ab_mega_device ab_pushpull; do cp /tmp/l/ab/$k/results.json $O/$k.json; done
(echo "== ab"; cat /tmp/o/ab/summary.txt; for k in ab_mega ab_mega_device ab_pushpull; do grep "^world size\|^| v\|^| mega\|^| torch" /tmp/l/ab/$k/table.md | head -6; done) >> $O/summaries.txt
echo "ab t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
