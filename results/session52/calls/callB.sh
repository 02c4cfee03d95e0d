#!/usr/bin/env bash
# Session 52 call B: where call A's cluster routing lost time. The PDL-behind-a-cluster probe
# (pdl_cluster.cu), then trace.py (each kernel's start / end in a dispatch, the host's counts
# wait) on the change and on main.   MAIN=<main tree> CHANGE=<branch tree> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
for t in $M $C; do [ -d $R/trees/$t ] || { echo "no tree $t"; exit 2; }; done
nvcc -std=c++17 -O3 -arch=sm_90a $R/results/session52/calls/pdl_cluster.cu -o /tmp/pc && /tmp/pc | tee $O/pdl_cluster.json
for t in $C $M; do
  (cd $R/trees/$t && SYMMOE_COMMIT=$t OUT=/tmp/o/$t LOG=/tmp/l/$t scripts/gpu_check.sh build 2>&1 | tail -1
   python3 $R/results/session52/calls/trace.py $O/trace_$t.json > $O/trace_$t.log 2>&1; tail -5 $O/trace_$t.log)
  echo "$t t=$SECONDS"
done
