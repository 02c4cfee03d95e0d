#!/usr/bin/env bash
# Prepared in session 40 (not run): next/pieces2 (results/session40/patches/int32-pieces.patch on
# main: a dispatch's int32 tensors from one allocation, the stream read once) against main, the host
# probe alternating in one lease (session 40 compared it only across leases: inconclusive; the
# probe now also times the after-wait work behind a 1 ms sleep, as the bench's timed calls run), then
# its nvshmem tests (none ran in session 40 G) and benches P / M as time allows. Trees:
#   git checkout -b next/pieces2 main && git am results/session40/patches/int32-pieces.patch
#   rm -rf trees; scripts/baseline_tree.sh main; scripts/baseline_tree.sh next/pieces2; cp results/session40/calls/next_call*.sh trees/
# Run with MAIN=<main's tree> PIECES=<its tree>. Merge if nvshmem's tests pass and the host's work
# before the wait is shorter in both pairs on both backends (it matters where no earlier GPU work
# hides it: the bench's 1 ms sleep does).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; P=${PIECES:?set PIECES}
. "$R/results/session34/calls/next_lib.sh"  # b, hp, tn, need_trees
need_trees $M $P
hp $M hm1; hp $P hp1; hp $M hm2; hp $P hp2
tn $P n 150 'bitwise or cached or num_worst or one_pe_dispatch_routes'
[ $SECONDS -lt 480 ] && b $P p1
[ $SECONDS -lt 530 ] && b $M m1
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
