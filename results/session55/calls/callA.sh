#!/usr/bin/env bash
# Session 55 call A: next/stream-query (S: the counts wait asks the stream, no event after the exact
# call's kernels) and a chunk probe (K: main's tree with kOwnChunkTokens 128) against main (M),
# W=1 torch push benches s / m / k in turns; then main's routed timelines at exact and worst size.
#   MAIN=<main tree> CHANGE=<stream-query tree> PROBE=<main tree>-k128 LIMIT=540 bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}; K=${PROBE:?set PROBE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C $K
L=${LIMIT:-540}
b $C s1 torch; b $M m1 torch; b $K k1 torch; b $C s2 torch; b $M m2 torch; b $K k2 torch
for ex in 1 0; do  # exact-size, then worst-size (TIMELINE_EXACT=0: num_worst_tokens)
  [ $SECONDS -lt $((L - 120)) ] || break
  (cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/tl$ex LOG=/tmp/l/tl$ex TIMELINE_ROUTED=1 TIMELINE_EXACT=$ex \
    TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push TIMELINE_LAYOUTS=rank timeout 120 scripts/gpu_check.sh timeline 2>&1 | tail -1
   cp /tmp/l/tl$ex/timeline.json $O/timeline_exact$ex.json; (echo "== timeline exact=$ex"; cat /tmp/l/tl$ex/timeline.txt) >> $O/summaries.txt)
done
[ $SECONDS -lt $((L - 100)) ] && { b $C s3 torch; b $M m3 torch; b $K k3 torch; }
finish $M s1 m1 k1 s2 m2 k2 s3 m3 k3
