#!/usr/bin/env bash
# Session 58 B: the rest of main's torch GPU tests (world size 1: the phased fan-out, the alone
# kernels, routing chunks, steal, small pieces), then nccl's tests and W=1 bench.
#   MAIN=<main> bash trees/callB.sh   (trees/<main> from scripts/baseline_tree.sh main)
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
P1='bitwise_equal_to_reference or cached_dispatch_moves or streamed or num_worst_tokens_returns or rank_major or absent or bad_expert_id_raises or bad_expert_id_with or receiver_over or x_built or payload or back_to_back or repeated or single_process or routing_kernel_leaves or timeline'
tt $M tb ${LIMIT:-330} "not ($P1)"
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/n LOG=/tmp/l/n timeout ${NCCL_LIMIT:-170} scripts/gpu_check.sh nccl 2>&1 | tail -1
 cp /tmp/l/n/nccl_bench.json $O/ 2>/dev/null; s "nccl" n)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
grep -c '^PASSED' $O/summaries.txt; grep '^FAILED\|^ERROR\|pytest\|nccl' $O/summaries.txt
