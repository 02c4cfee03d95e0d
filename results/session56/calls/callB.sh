#!/usr/bin/env bash
# Session 56 B: timing_probe.py --exact with the wait watched, on main's tree; then main's torch
# tests session 55 did not run.  MAIN=<main> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
mkdir -p /tmp/l/p
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -1
 timeout 120 python3 scripts/timing_probe.py --protocols push --exact --json $O/probe.json 2>&1 | tee /tmp/l/p/probe.txt
 (echo "== timing probe"; cat /tmp/l/p/probe.txt) >> $O/summaries.txt)
echo "probe t=$SECONDS"
tt $M tr ${TORCH_LIMIT:-150} '(receiver_over and push) or rows_split or fan_out_in_phases'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep '^FAILED\|^ERROR\|pytest\|passed\|failed' $O/summaries.txt | tail -5
