#!/usr/bin/env bash
# Prepared in session 39 (not run): after next_callA.sh. next/both (next/spec plus the routed
# timeline's counted mark, results/session39/patches/routed-counted-stamp-on-spec.patch): its
# routed tests and timeline (both layouts: the expert-major chunks' count against their place,
# the rank-major first stores, which should move from ~11-15 µs to round 0's landing); benches S / M
# once more; main's tests that the masked routing's whole masked tokens reach at more ranks (torch
# bitwise at 1, 2, 4 processes; nccl's 15). Trees: scripts/baseline_tree.sh for main, next/spec,
# next/both. Run with MAIN=<main's tree> SPEC=<next/spec's tree> BOTH=<next/both's tree>.
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; T=${SPEC:?set SPEC}; B=${BOTH:?set BOTH}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt, tn, need_trees
need_trees $M $T $B
tt $B tb 90 'routed_kernel_s_timeline or routes_inside'
tl $B lt
b $T s3; b $M m3
[ $SECONDS -lt 330 ] && tt $M tm 190 'bitwise_equal or routing_split'
if [ $SECONDS -lt 530 ]; then
  (cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh build nccl 2>&1 | tail -1)
  s "nccl" c; grep -h "passed\|failed" /tmp/l/c/nccl_tests.log >> $O/summaries.txt 2>/dev/null
fi
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
