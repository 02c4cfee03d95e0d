#!/usr/bin/env bash
# Session 58 D: the three nvshmem tests C's limit cut (absent rank at 2 and 4 PEs, memory peer
# bases and barrier), then two more W=1 benches of torch push and nvshmem.
#   MAIN=<main> bash trees/callD.sh   (trees/<main> from scripts/baseline_tree.sh main)
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tn $M nd ${NV_LIMIT:-200} "absent or memory_peer"
b $M m2; [ $SECONDS -lt 330 ] && b $M m3
finish $M m2 m3
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
