#!/usr/bin/env bash
# Prepared in session 43 for the next GPU session: next/ab-timing (`results/session43/patches/ab-timing.patch`
# on main; `symmoe ab --timing device`: each GPU call queued behind a 1 ms sleep, as the bench
# times it). gpu_check's ab section on that tree now runs v1_v2_mega at W=1 twice (timing call,
# then device) and push_vs_pull at W=4. Merge if both W=1 runs pass their bitwise check and the
# device table's cached dispatches read near the bench's (32-35 µs rank-major kernels) instead of
# 202-336 µs. From main's working copy:
#   git checkout -b next/ab-timing && git am results/session43/patches/ab-timing.patch && git checkout main
#   rm -rf trees; scripts/baseline_tree.sh next/ab-timing; cp results/session43/calls/next_callA.sh trees/
#   ABT=<its tree> bash trees/next_callA.sh
R=$PWD; O=$OUT; T=${ABT:?set ABT}
. "$R/results/session34/calls/next_lib.sh"  # need_trees
need_trees $T
(cd $R/trees/$T && SYMMOE_COMMIT=$T OUT=/tmp/o/ab LOG=/tmp/l/ab timeout 400 scripts/gpu_check.sh build ab 2>&1 | tail -1)
for k in ab_mega ab_mega_device ab_pushpull; do cp /tmp/l/ab/$k/results.json $O/$k.json; done
(echo "== ab"; cat /tmp/o/ab/summary.txt; for k in ab_mega ab_mega_device ab_pushpull; do grep "^world size\|^| v\|^| mega\|^| torch" /tmp/l/ab/$k/table.md | head -6; done) >> $O/summaries.txt
echo "ab t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
