#!/usr/bin/env bash
# Prepared in session 36 (not run): patch 3 (3-v4-rank-own-chunks: rank-major blocks wait only for the chunks
# of their round 0 rows before loading them, where V4 waits for every chunk). Trees: next_callA.sh's V, and
#   git checkout -b next/v4r next/v4 && git am results/session36/patches/3-v4-rank-own-chunks.patch
#   scripts/baseline_tree.sh next/v4r
# run with V4=<V's tree> V4R=<its tree>: torch tests of the routed kernel on it, its timeline, torch benches
# W / V / W / V (the expert-major kernel is the same in both: only the rank-major rows differ).
R=$PWD; O=$OUT; V=${V4:?set V4}; WT=${V4R:?set V4R}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $WT tw 200 'routes_inside or routed_kernel or alone_bad or (num_worst and 1-) or (bitwise_equal and 1-)'
tl $WT lw
b $WT w1 torch; b $V v1 torch
[ $SECONDS -lt 490 ] && b $WT w2 torch
[ $SECONDS -lt 540 ] && b $V v2 torch
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
