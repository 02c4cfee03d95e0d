#!/usr/bin/env bash
# Session 37, call B: kernel.fan_pace (next/pace, tree $PACE): the routed kernel's round 0 loads
# paced (at most `pace` rows a block in flight). Torch tests of the paced and routed kernels,
# the routed timeline at pace 0 and 4, torch benches at pace 0 / 4 / 8 / 2 / 0 / 4.
R=$PWD; O=$OUT; P=${PACE:?set PACE}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $P tp 200 'paced or (routes_inside and 132) or alone_bad or timeline'
TIMELINE_VARIANTS='kernel.fan_pace=4' tl $P lp
for v in 0 4 8 2 0 4; do
  [ $SECONDS -lt 540 ] && BENCH_SET="kernel.fan_pace=$v" b $P p$v-$SECONDS torch
done
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
