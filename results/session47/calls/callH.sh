#!/usr/bin/env bash
# Session 47 call H: next/rank-team (ebe898d: the rank-major routing team alone) against next/s47
# (500ea6b: the same plus the expert-major changes and 16 loads in chunk_sum_vec), to tell what
# call G's gain comes from and whether the expert-major changes cost nvshmem ~2 device µs. The
# team alone's tests (torch routed kernels, nvshmem one PE), then benches rt / s47 / rt / s47
# (torch, nvshmem push, W=1).
#   RT=<next/rank-team tree> S47=<next/s47 tree> LIMIT=<s> bash trees/callH.sh
R=$PWD; O=$OUT; A=${RT:?set RT}; B=${S47:?set S47}
. "$R/results/session34/calls/next_lib.sh"
need_trees $A $B
L=${LIMIT:-420}
tt $A t 120 'final_for_the_next_op or rank_major_rows or (num_worst and 1-) or (routes_inside and rank) or alone_bad'
grep -q "^FAILED\|^ERROR" $O/summaries.txt && { echo "tests failed: no bench"; tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null; exit 1; }
tn $A n 60 'one_pe_dispatch_routes_inside or one_pe_bad'
b $A rt1; b $B s1
[ $SECONDS -lt $((L - 70)) ] && b $A rt2
[ $SECONDS -lt $((L - 35)) ] && b $B s2
ls=$(for l in rt1 s1 rt2 s2; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$A python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
