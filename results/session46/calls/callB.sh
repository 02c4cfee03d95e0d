#!/usr/bin/env bash
# Session 46, call B: next/repair-early (the W=1 rank-major repair kernel starts on the routing's
# end word, RouteScratch::ended, and ends without waiting for the routed grid when every token's
# row is at t) against main. Its GPU tests (torch: the new stream-order test, the repair test with
# per-expert counts, num_worst_tokens, routing inside rank-major, bad ids / capacity; nvshmem: one
# PE), benches change / main / change / main (torch, nvshmem push, W=1), nccl W=1 tests if time.
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/repair-early; cp results/session46/calls/callB.sh trees/
#   MAIN=<main's tree> NEW=<next/repair-early's tree> LIMIT=<s> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $N
L=${LIMIT:-560}
tt $N t 170 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or (alone_bad and rank)'
tn $N n 80 'one_pe_dispatch_routes_inside or one_pe_bad'
b $N c1; b $M m1
[ $SECONDS -lt $((L - 120)) ] && b $N c2
[ $SECONDS -lt $((L - 80)) ] && b $M m2
[ $SECONDS -lt $((L - 90)) ] && (cd $R/trees/$N && echo "== nccl tests" && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SYMMOE_CACHE=/tmp/symmoe-cache \
  timeout -s INT $((L - 10 - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_nccl.py -k 'num_worst or dispatch_combine_bitwise' 2>&1 \
  | grep -E '^(PASSED|FAILED|ERROR)|passed|failed' | tail -8) >> $O/summaries.txt; echo "nccl t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
