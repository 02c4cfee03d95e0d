#!/usr/bin/env bash
# Session 45, call B: next/tail-fold (the W=1 routed rank-major dispatch's repair kernel in blocks of
# 128 threads, resident beside the routed kernel, and doing num_worst_tokens' tail: no tail kernel)
# against main. Its GPU tests (torch: the repair test with its per-expert counts, num_worst_tokens,
# the routing inside rank-major, bad ids / capacity, bitwise at W=1; nvshmem: one PE, bitwise at
# 1 PE; nccl: num_worst_tokens and bitwise at W=1), then benches change / main / change / main (torch, nvshmem push, W=1).
# From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/tail-fold; cp results/session45/calls/callB.sh trees/
#   MAIN=<main's tree> NEW=<next/tail-fold's tree> BUSY=<next/kernel-busy's tree> LIMIT=<s> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"  # b, tt, tn, need_trees, ab_benches
need_trees $M $N
L=${LIMIT:-560}  # the call's own limit (the device time left may be less than 600 s)
tt $N t 150 'rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or (alone_bad and rank)'
tn $N n 80 'one_pe_dispatch_routes_inside or one_pe_bad'
b $N c1; b $M m1
[ $SECONDS -lt $((L - 120)) ] && b $N c2
[ $SECONDS -lt $((L - 80)) ] && b $M m2
# next/kernel-busy (Python only): the profiler's union of a call's kernels (ops.BUSY) on a plain
# torch op and on a pair of kernels that overlap (two streams), beside the per-kernel sums.
(cd $R/trees/${BUSY:?set BUSY} && timeout 60 python3 -c "
import torch
from symmoe.bench import kernel_breakdown
a = torch.randn(1 << 26, device='cuda'); s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
def two():
    e = torch.cuda.current_stream().record_event(); s1.wait_event(e); s2.wait_event(e)
    with torch.cuda.stream(s1): a.mul(2)
    with torch.cuda.stream(s2): a.add(1)
    torch.cuda.current_stream().wait_stream(s1); torch.cuda.current_stream().wait_stream(s2)
print('one', kernel_breakdown(lambda: a.mul(2)))
print('two', kernel_breakdown(two))
" 2>&1 | tail -4) >> $O/summaries.txt
[ $SECONDS -lt $((L - 90)) ] && (cd $R/trees/$N && echo "== nccl tests" && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SYMMOE_CACHE=/tmp/symmoe-cache \
  timeout -s INT $((L - 10 - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_nccl.py -k 'num_worst or dispatch_combine_bitwise' 2>&1 \
  | grep -E '^(PASSED|FAILED|ERROR)|passed|failed' | tail -8) >> $O/summaries.txt; echo "nccl t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
