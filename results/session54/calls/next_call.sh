#!/usr/bin/env bash
# For session 55 (not run yet): next/stream-query (6dde302: the counts wait asks the stream; no
# event recorded after the exact call's kernels) against main (MAIN), W=1 torch push benches
# s / m in turns; then the routed timelines of main's exact-size and worst-size rank dispatch,
# to find the exact call's last ~1 µs over the worst-size call (session 54 B).
#   bash scripts/baseline_tree.sh main; bash scripts/baseline_tree.sh next/stream-query
#   cp results/session54/calls/next_call.sh trees/
#   MAIN=<main tree> CHANGE=<stream-query tree> LIMIT=<s> bash trees/next_call.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-540}
b $C s1 torch; b $M m1 torch; b $C s2 torch; b $M m2 torch
for ex in 1 0; do  # exact-size, then worst-size (TIMELINE_EXACT=0: num_worst_tokens)
  (cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/tl$ex LOG=/tmp/l/tl$ex TIMELINE_ROUTED=1 TIMELINE_EXACT=$ex \
    TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push TIMELINE_LAYOUTS=rank timeout 120 scripts/gpu_check.sh timeline 2>&1 | tail -1
   cp /tmp/l/tl$ex/timeline.json $O/timeline_exact$ex.json; (echo "== timeline exact=$ex"; cat /tmp/l/tl$ex/timeline.txt) >> $O/summaries.txt)
done
[ $SECONDS -lt $((L - 70)) ] && { b $C s3 torch; b $M m3 torch; }
finish $M s1 m1 s2 m2 s3 m3
