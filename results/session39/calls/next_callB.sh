#!/usr/bin/env bash
# Prepared in session 39 (not run): after next_callA.sh. Benches S / M once more, the rank-major
# routed timeline of next/spec (first stores should move from ~11-15 µs to round 0's landing),
# then main's tests that the masked routing's whole masked tokens reach at more ranks (torch
# bitwise at 1, 2, 4 processes; nccl's 15). Run with MAIN=<main's tree> SPEC=<next/spec's tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${SPEC:?set SPEC}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn, need_trees
need_trees $M $T
b $T s3; b $M m3; tl $T lt
tt $M tm 200 'bitwise_equal or routing_split'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh build nccl 2>&1 | tail -1)
s "nccl" c; grep -h "passed\|failed" /tmp/l/c/nccl_tests.log >> $O/summaries.txt 2>/dev/null
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
