#!/usr/bin/env bash
# Session 46, call C: next/repair-tail (experiment) against main. alone_rows_routed_kernel does
# num_worst_tokens' tail itself and tail-launches its repair (CUDA dynamic parallelism) only where
# a token has no row, so the usual worst rank dispatch is one kernel; symmoe_cuda is built with
# relocatable device code for it (which changes other kernels' code: the benches show that too).
# Tests (torch: stream order, the repair test = the tail-launched path, num_worst_tokens, routing
# inside rank-major, bad ids / capacity; nvshmem: one PE), then benches change / main / change / main.
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/repair-tail; cp results/session46/calls/callC.sh trees/
#   MAIN=<main's tree> NEW=<next/repair-tail's tree> LIMIT=<s> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $N
L=${LIMIT:-560}
tt $N t 170 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or (alone_bad and rank)'
tn $N n 80 'one_pe_dispatch_routes_inside or one_pe_bad'
b $N c1; b $M m1
[ $SECONDS -lt $((L - 70)) ] && b $N c2
[ $SECONDS -lt $((L - 35)) ] && b $M m2
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
