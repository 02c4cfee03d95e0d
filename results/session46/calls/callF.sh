#!/usr/bin/env bash
# Prepared in session 46, not run: the next session's first call. Where the W=1 rank-major
# dispatch that routes loses its 1.5-2 device µs against the cached dispatch: main's routed
# kernel's timeline (its marks: ticket, walked / scanned / counted, built, planned, routed, first
# push, flushed) and the cached dispatch's (launch skew, prologue, copy loop, drain), both rank-
# major, torch push, warp by warp; then main's W=1 push bench once for the lease's baseline.
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; cp results/session46/calls/callF.sh trees/
#   MAIN=<main's tree> bash trees/callF.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # tl, b, need_trees
need_trees $M
tl $M routed
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/cached LOG=/tmp/l/cached TIMELINE_BACKENDS=torch TIMELINE_LAYOUTS=rank \
  BENCH_PROTOCOLS=push scripts/gpu_check.sh timeline 2>&1 | tail -1; cp /tmp/l/cached/timeline.json $O/timeline_cached.json
  (echo "== timeline cached"; cat /tmp/l/cached/timeline.txt) >> $O/summaries.txt); echo "cached t=$SECONDS"
b $M m1 torch
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
