#!/usr/bin/env bash
# Session 47, the chunk sweep (call H if the device lends it): next/chunk-sweep 4f14130, whose
# kernels are next/s47's plus an experiment's override of the own routing's tokens a chunk per
# layout (SYMMOE_OWN_CHUNK_RANK / _EXPERT; 64 on main and next/s47). Torch push W=1 benches at 64 /
# 128 / 256 / 32 tokens a chunk in one lease (64 the baseline), then the routed timeline at 64
# (the rank-major routing team's marks).
#   SWEEP=<next/chunk-sweep's tree> bash trees/callSweep.sh
R=$PWD; O=$OUT; N=${SWEEP:?set SWEEP}
. "$R/results/session34/calls/next_lib.sh"
need_trees $N
sw() { export SYMMOE_OWN_CHUNK_RANK=$2 SYMMOE_OWN_CHUNK_EXPERT=$2; b $N $1 torch; unset SYMMOE_OWN_CHUNK_RANK SYMMOE_OWN_CHUNK_EXPERT; }
sw s64 64
sw s128 128
sw s256 256
[ $SECONDS -lt 380 ] && sw s32 32
[ $SECONDS -lt 440 ] && tl $N routed64
ls=$(for l in s64 s128 s256 s32; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$N python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
