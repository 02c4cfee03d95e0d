#!/usr/bin/env bash
# Prepared in session 49, not run (no device time was left): main's stamped timelines of the
# W=1 expert-major dispatch, cached (the phased fan-out's marks: loads, stores, rounds) and
# routed (its routed kernel's marks), torch push, in one lease, to compare their rounds warp by
# warp (results/NOTES.md, session 49, "Next GPU session" 2).
#   MAIN=<main tree> bash trees/callR.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/c LOG=/tmp/l/c TIMELINE_BACKENDS=torch TIMELINE_LAYOUTS=expert \
  BENCH_PROTOCOLS=push scripts/gpu_check.sh build timeline 2>&1 | tail -1
 cp /tmp/l/c/timeline.json $O/timeline_cached.json; (echo "== timeline cached"; cat /tmp/l/c/timeline.txt) >> $O/summaries.txt)
echo "cached t=$SECONDS"
tl $M routed
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
