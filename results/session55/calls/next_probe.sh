#!/usr/bin/env bash
# For session 56 (not run yet): scripts/timing_probe.py --exact on main's tree (the exact call's
# last µs: its end event recorded after the wait, or its kernel?), then main's torch tests that
# session 55 did not run (~120 s).
#   bash scripts/baseline_tree.sh main; cp results/session55/calls/next_probe.sh trees/
#   MAIN=<main tree> bash trees/next_probe.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -1
 timeout 150 python3 scripts/timing_probe.py --protocols push,pull --exact --json $O/probe.json 2>&1 | tee /tmp/l/p/probe.txt
 (echo "== timing probe"; cat /tmp/l/p/probe.txt) >> $O/summaries.txt)
echo "probe t=$SECONDS"
tt $M tr ${TORCH_LIMIT:-150} '(receiver_over and push) or rows_split or fan_out_in_phases'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep '^FAILED\|^ERROR\|pytest\|routed' $O/summaries.txt
