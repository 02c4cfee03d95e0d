#!/usr/bin/env bash
# session 34, call E (debug): trees/dbgt = b18f193 with fprintf(stderr) marks in Ctx::route_alone_as and
# launch_alone_routed (R0-R2, L1-L5). Result: L3 printed, L4 not: the process ended in the geometry code,
# at RoutingArgs::columns(), a __device__ function called from the host (fixed in f8741ac).
R=$PWD; O=$OUT
cd $R/trees/dbgt && export SYMMOE_COMMIT=dbgt
MPS=off OUT=/tmp/o/b LOG=/tmp/l/b scripts/gpu_check.sh build 2>&1 | tail -1
export PYTHONUNBUFFERED=1 SYMMOE_CACHE=/tmp/symmoe-cache
echo "tools: $(which gdb strace ltrace 2>/dev/null | tr '\n' ' ')" > $O/e.txt
for a in "64 256 16" "2048 7168 132"; do
  timeout 60 python3 -X faulthandler $R/trees/dbg.py $a >> $O/e.txt 2>&1; echo "rc=$? $a" >> $O/e.txt
done
tail -30 $O/e.txt
