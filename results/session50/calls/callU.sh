#!/usr/bin/env bash
# Session 50 call U: the microbenchmark alone (scripts/microbench/row_copy.cu of this tree), its
# phased fan-out now also with a warp's stores 1, 2 or 4 in flight.
#   bash trees/callU.sh
R=$PWD; O=$OUT
(nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/rc $R/scripts/microbench/row_copy.cu && timeout 150 /tmp/rc) > $O/micro.txt 2>&1
echo "micro t=$SECONDS"
