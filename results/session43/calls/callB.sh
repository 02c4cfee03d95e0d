#!/usr/bin/env bash
# Session 43 B: main's A/B runs on the GPU (the README's main job and the two GPU A/B specs,
# last run on a GPU in session 18) and the four-ranks-under-MPS bench (last in session 32 H),
# on main's tree. From main's working copy:
#   rm -rf trees; scripts/baseline_tree.sh main; cp results/session43/calls/callB.sh trees/
#   MAIN=<its tree> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # need_trees
need_trees $M
cd $R/trees/$M
# gpu_check's ab section: v1_v2_mega at W=1 (nvshmem vs nccl vs torch, bitwise-checked) and push_vs_pull at W=4 under MPS
SYMMOE_COMMIT=$M OUT=/tmp/o/ab LOG=/tmp/l/ab timeout 330 scripts/gpu_check.sh build ab 2>&1 | tail -1
cp /tmp/l/ab/ab_mega/results.json $O/ab_mega.json; cp /tmp/l/ab/ab_pushpull/results.json $O/ab_pushpull.json
(echo "== ab"; cat /tmp/o/ab/summary.txt; cat /tmp/l/ab/ab_mega/table.md /tmp/l/ab/ab_pushpull/table.md) >> $O/summaries.txt
echo "ab t=$SECONDS"
# the README's main command on a GPU machine (world_size auto: one rank on the one GPU)
(timeout 90 python3 -m symmoe.ab configs/ab/quickstart.yaml --out /tmp/l/qs > /tmp/l/qs.log 2>&1; echo "exit $?" >> /tmp/l/qs.log)
cp /tmp/l/qs/results.json $O/quickstart.json; (echo "== quickstart"; tail -30 /tmp/l/qs.log) >> $O/summaries.txt
echo "qs t=$SECONDS"
# four ranks under MPS, aggregate over the device's copy roofline (10 repeats, as session 32 H)
[ $SECONDS -lt 330 ] && { SYMMOE_COMMIT=$M BENCH_WORLD_SIZES=4 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=pull,push BENCH_REPEATS=10 \
  OUT=/tmp/o/w4 LOG=/tmp/l/w4 timeout $((560 - SECONDS)) scripts/gpu_check.sh bench 2>&1 | tail -1
  cp /tmp/l/w4/bench.json $O/bench_w4.json; (echo "== W=4 bench"; cat /tmp/o/w4/summary.txt) >> $O/summaries.txt; }
echo "w4 t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
