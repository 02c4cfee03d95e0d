#!/usr/bin/env bash
# Session 56 A: scripts/timing_probe.py --exact on main's tree (is the exact call's last µs its end
# record after the wait?), then main against a probe tree whose hand_counts fence is GPU-scope
# (timing only), W=1 torch push, in turns while the call has time.
#   MAIN=<main> PROBE=<main>-gf bash trees/callA.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PROBE:?set PROBE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $P
grep -q "PROBE: every thread" $R/trees/$P/csrc/kernels/route.cuh || { echo "no probe edit in trees/$P" | tee -a $O/summaries.txt; exit 2; }
mkdir -p /tmp/l/p
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -1
 timeout 120 python3 scripts/timing_probe.py --protocols push,pull --exact --json $O/probe.json 2>&1 | tee /tmp/l/p/probe.txt
 (echo "== timing probe"; cat /tmp/l/p/probe.txt) >> $O/summaries.txt)
echo "probe t=$SECONDS"
b $P g1 torch; b $M m1 torch
[ $SECONDS -lt 330 ] && b $P g2 torch
[ $SECONDS -lt 370 ] && b $M m2 torch
finish $M g1 m1 g2 m2
