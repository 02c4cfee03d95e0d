#!/usr/bin/env bash
# Prepared in session 35 for the next GPU session (not run). The patches of results/session35/patches, a
# series: chunk64 (the routed kernel's chunks of 64 tokens), rows-own-chunk (rank-major warps wait for their
# own chunk's mark), routed-timeline (the routed kernel's stamped build, timeline_probe.py --routed). The first
# two ran on torch in session 35 D (20 tests passed; rank worst dispatch 46.4 -> 44.8-45.2 µs) but never on
# nvshmem, which runs the same kernel through alone_routed; the third never ran. Trees:
#   git checkout -b next/s35 main && git am results/session35/patches/{chunk64,rows-own-chunk,routed-timeline,rank-row-meta}.patch
#   scripts/baseline_tree.sh next/s35; scripts/baseline_tree.sh main
# run with PATCHED=<its tree name> MAIN=<main's tree name>: nvshmem one-PE tests, then benches P / M / P / M.
# next_callB.sh: the torch tests of the stamped build, and the routed kernel's timeline.
R=$PWD; O=$OUT; P=${PATCHED:?set PATCHED}; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$P && export SYMMOE_COMMIT=$P
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=240 FAULT_S=230 PYTEST_ARGS="-rA -k 'one_pe or (bitwise and 1) or (cached and 1) or (worst and 1) or (summary and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1
s "nvshmem s35 patches" n; echo "t=$SECONDS"
b $P p1
b $M main1
[ $SECONDS -lt 480 ] && b $P p2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l n 2>/dev/null
