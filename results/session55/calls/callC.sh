#!/usr/bin/env bash
# Session 55 call C: main's nvshmem GPU suite but the one-PE tests (which session 54 A ran), then the
# torch tests call B's limit cut (the error paths at 2-4 processes, small copy pieces).
#   MAIN=<main tree> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tn $M nc ${NV_LIMIT:-250} "${NV_K:-not one_pe}"
[ "${TORCH_LIMIT:-120}" -gt 0 ] && tt $M tc ${TORCH_LIMIT:-120} 'absent or bad_expert_id_raises or bad_expert_id_with or receiver_over or rows_split'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
