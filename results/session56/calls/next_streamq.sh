#!/usr/bin/env bash
# For session 57 (not run yet): session 55's next/stream-query (no event recorded after the exact
# W=1 call's kernels) against main, in turns up to three times each, W=1 torch push benches, with
# end_record.py at the start and the end of the call: a run counts only if end_record's mid rows
# stay within 2 µs of queued (session 56 C-E: an end event submitted mid-kernel completes 0-28 µs
# late, varying run to run). Then the W=1 bad id and capacity test x4 on main.
#   bash scripts/baseline_tree.sh main; bash scripts/baseline_tree.sh next/stream-query
#   cp results/session56/calls/next_streamq.sh trees/; MAIN=<main> CHANGE=<6dde302> bash trees/next_streamq.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
mkdir -p /tmp/l/e
er() { PYTHONPATH=$R:$PYTHONPATH timeout 60 python3 "$R/scripts/microbench/end_record.py" > /tmp/l/e/end_record$1.txt 2>&1
       (echo "== end_record $1"; cat /tmp/l/e/end_record$1.txt) >> $O/summaries.txt; }
er 1
b $C c1 torch; b $M m1 torch; b $C c2 torch; b $M m2 torch
[ $SECONDS -lt 400 ] && b $C c3 torch
[ $SECONDS -lt 430 ] && b $M m3 torch
er 2
tt $M ta 60 'alone_bad'
finish $M c1 m1 c2 m2 c3 m3
