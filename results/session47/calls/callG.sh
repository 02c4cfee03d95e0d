#!/usr/bin/env bash
# Session 47 call G: next/s47 (500ea6b) against main (5ce4889). next/s47: the W=1 rank-major routed
# kernel's routing blocks move rows with their mover warps while their other warps route the chunk
# (WarpTeam on a named barrier); expert-major, the readers' atomic answered at the block's end and
# token_placed reading the error word only while a chunk's mark is missing; chunk_sum_vec with 16
# loads in flight. Its torch tests of the routed kernels first (a named barrier that never met
# would hang the benches), nvshmem's one-PE routed tests, then benches change / main / change /
# main (torch, nvshmem push, W=1), nccl's W=1 tests while time is left.
#   MAIN=<main tree> NEW=<next/s47 tree> LIMIT=<s> bash trees/callG.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; N=${NEW:?set NEW}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $N
L=${LIMIT:-540}
tt $N t 150 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or routes_inside or alone_bad'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tn $N n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
b $N c1; b $M m1
[ $SECONDS -lt $((L - 150)) ] && b $N c2
[ $SECONDS -lt $((L - 75)) ] && b $M m2
[ $SECONDS -lt $((L - 60)) ] && (cd $R/trees/$N && echo "== nccl tests" && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SYMMOE_CACHE=/tmp/symmoe-cache \
  timeout -s INT $((L - 10 - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_nccl.py -k 'num_worst or dispatch_combine_bitwise' 2>&1 \
  | grep -E '^(PASSED|FAILED|ERROR)|passed|failed' | tail -8) >> $O/summaries.txt; echo "nccl t=$SECONDS"
ls=$(for l in c1 m1 c2 m2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
