#!/usr/bin/env bash
# Session 50 call T: the microbenchmark with the phased fan-out split into its stores alone and
# its loads alone (scripts/microbench/row_copy.cu of this tree; before MPS starts), then session
# 49's prepared callR: main's stamped timelines of the cached and the routed W=1 expert-major
# dispatch (torch push) in one lease.
#   MAIN=<main tree> bash trees/callT.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
(nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/rc $R/scripts/microbench/row_copy.cu && timeout 150 /tmp/rc) > $O/micro.txt 2>&1
echo "micro t=$SECONDS"
OUT=$O bash $R/results/session49/calls/callR.sh
