#!/usr/bin/env bash
# Session 55 call B: main's torch GPU suite but the phased fan-out modes (W=1, 16 tests), after the
# counts wait moved into C++ (session 54 ran its W=1 selection only).
#   MAIN=<main tree> LIMIT=520 bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tt $M tb ${LIMIT:-520} 'not fan_out_in_phases'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
