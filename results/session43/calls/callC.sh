#!/usr/bin/env bash
# Session 43 C: next/host (the host's work of a call: the launches' stream handle without a
# torch.cuda.Stream, and a cached dispatch reading its rows off the handle instead of reducing
# the matrix again) against main. Its GPU tests (torch: bitwise at W=1, cached dispatch at 1, 2, 4,
# num_worst_tokens at 1, 2, back-to-back combines; nvshmem: cached, num_worst_tokens,
# back-to-back), then benches change / main / change / main (torch, nvshmem push, W=1), whose
# "host inside the call" table (bench_compare) is the measure. From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/host; cp results/session43/calls/callC.sh trees/
#   MAIN=<main's tree> HOST=<next/host's tree> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; H=${HOST:?set HOST}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $H
tt $H tt 130 'cached_dispatch_moves or num_worst_tokens_returns or (bitwise_equal and 1-) or back_to_back'
tn $H n 90 'cached_dispatch or num_worst_tokens_returns or back_to_back'
b $H c1; b $M m1
[ $SECONDS -lt 420 ] && b $H c2
[ $SECONDS -lt 460 ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
