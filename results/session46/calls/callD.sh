#!/usr/bin/env bash
# Session 46, call D: next/rank-once against main. The W=1 rank-major dispatch that routes is one
# kernel: alone_rows_routed_kernel does num_worst_tokens' tail itself, and its grid meets (a
# cooperative launch) to move rows again only where a token has no row. Its GPU tests (torch:
# stream order, the repair test = the meeting path, num_worst_tokens, routing inside rank-major,
# bad ids / capacity; nvshmem: one PE), benches change / main / change / main (torch, nvshmem
# push, W=1), nccl W=1 tests if time.
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/rank-once; cp results/session46/calls/callD.sh trees/
#   MAIN=<main's tree> NEW=<next/rank-once's tree> LIMIT=<s> bash trees/callD.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees
need_trees $M $N
L=${LIMIT:-560}
tt $N t 170 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or (alone_bad and rank)'
tn $N n 80 'one_pe_dispatch_routes_inside or one_pe_bad'
b $N c1; b $M m1
[ $SECONDS -lt $((L - 70)) ] && b $N c2
[ $SECONDS -lt $((L - 35)) ] && b $M m2
[ $SECONDS -lt $((L - 25)) ] && (cd $R/trees/$N && echo "== nccl tests" && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SYMMOE_CACHE=/tmp/symmoe-cache \
  timeout -s INT $((L - 10 - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_nccl.py -k 'num_worst or dispatch_combine_bitwise' 2>&1 \
  | grep -E '^(PASSED|FAILED|ERROR)|passed|failed' | tail -8) >> $O/summaries.txt; echo "nccl t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
