#!/usr/bin/env bash
# Session 58 A: main's torch GPU tests that run several ranks (and the W=1 ones beside them in the
# same test functions), the first part of the closing acceptance run on one commit.
#   bash scripts/baseline_tree.sh main; cp results/session58/calls/callA.sh trees/
#   MAIN=<main> bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
P1='bitwise_equal_to_reference or cached_dispatch_moves or streamed or num_worst_tokens_returns or rank_major or absent or bad_expert_id_raises or bad_expert_id_with or receiver_over or x_built or payload or back_to_back or repeated or single_process or routing_kernel_leaves or timeline'
tt $M ta ${LIMIT:-480} "$P1"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest' $O/summaries.txt
