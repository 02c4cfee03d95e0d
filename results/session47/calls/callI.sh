#!/usr/bin/env bash
# Session 47 call I: what call G's gain comes from. next/k16 (main + chunk_sum_vec's 16 loads in
# flight, nothing else) against next/final (the rank-major routing team + those 16 loads +
# token_placed's error word read only while a mark is missing; without G's deferred readers'
# atomic). Tests: torch routed kernels on both (final: both layouts), nvshmem one PE on final;
# then benches k16 / final / k16 / final (torch, nvshmem push, W=1).
#   K16=<next/k16 tree> FIN=<next/final tree> LIMIT=<s> bash trees/callI.sh
R=$PWD; O=$OUT; A=${K16:?set K16}; B=${FIN:?set FIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $A $B
L=${LIMIT:-460}
tt $B tf 120 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or routes_inside or alone_bad'
tt $A tk 60 'final_for_the_next_op or rank_major_rows or (routes_inside and rank) or alone_bad'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tn $B n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
b $A k1; b $B f1
[ $SECONDS -lt $((L - 70)) ] && b $A k2
[ $SECONDS -lt $((L - 35)) ] && b $B f2
ls=$(for l in k1 f1 k2 f2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$A python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
