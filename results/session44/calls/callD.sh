#!/usr/bin/env bash
# Session 44, call D: main with next/rank-mover merged and the repair's unroll (its HEAD tree):
# the repair and rank-major routed tests (torch), the one-PE routed dispatch (nvshmem), then
# gpu_check's ab section (v1_v2_mega at W=1, timing call and device; push_vs_pull at W=4).
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; cp results/session44/calls/callD.sh trees/
#   MAIN=<main's tree> bash trees/callD.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # tt, tn, need_trees
need_trees $M
tt $M t 60 'rank_major_rows or (routes_inside and rank and 132)'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/ab LOG=/tmp/l/ab timeout 200 scripts/gpu_check.sh ab 2>&1 | tail -1)
for k in ab_mega ab_mega_device ab_pushpull; do cp /tmp/l/ab/$k/results.json $O/$k.json; done
(echo "== ab"; cat /tmp/o/ab/summary.txt; for k in ab_mega ab_mega_device ab_pushpull; do grep "^world size\|^\*\*bitwise\|^| v\|^| mega\|^| torch" /tmp/l/ab/$k/table.md | head -7; done) >> $O/summaries.txt
echo "ab t=$SECONDS"
[ $SECONDS -lt 250 ] && tn $M n 70 'routes_inside'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
