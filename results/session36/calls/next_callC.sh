#!/usr/bin/env bash
# Prepared in session 36 (not run): patch 3 (3-v4-rank-own-chunks: rank-major blocks wait only for the chunks
# of their round 0 rows before loading them, where V4 waits for every chunk). Trees: next_callA.sh's V, and
#   git checkout -b next/v4r next/v4 && git am results/session36/patches/3-v4-rank-own-chunks.patch
#   scripts/baseline_tree.sh next/v4r
# run with V4=<V's tree> V4R=<its tree>: torch tests of the routed kernel on it, its timeline, torch benches
# W / V / W / V (the expert-major kernel is the same in both: only the rank-major rows differ).
R=$PWD; O=$OUT; V=${V4:?set V4}; WT=${V4R:?set V4R}
. "$R/results/session34/calls/next_lib.sh"  # s, bt, tl
(cd $R/trees/$WT && SYMMOE_COMMIT=$WT OUT=/tmp/o/tw LOG=/tmp/l/tw TEST_LIMIT_S=200 FAULT_S=190 \
  PYTEST_ARGS="-rA -k 'routes_inside or routed_kernel or alone_bad or (num_worst and 1-) or (bitwise_equal and 1-)'" \
  scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch W" tw; echo "t=$SECONDS"
tl $WT lw
bt $WT w1; bt $V v1
[ $SECONDS -lt 490 ] && bt $WT w2
[ $SECONDS -lt 540 ] && bt $V v2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
