#!/usr/bin/env bash
# session 34, call C (debug): b18f193's W=1 expert dispatch died silently in B (exit 1, no output).
# dbg.py at three shapes, then compute-sanitizer memcheck on the smallest. Result: rc 1 each, 0 memcheck errors.
R=$PWD; O=$OUT
cd $R/trees/b18f193 && export SYMMOE_COMMIT=b18f193
MPS=off OUT=/tmp/o/b LOG=/tmp/l/b scripts/gpu_check.sh build 2>&1 | tail -1
export PYTHONUNBUFFERED=1 SYMMOE_CACHE=/tmp/symmoe-cache
for a in "64 256 16" "96 256 2" "2048 7168 132"; do
  timeout 60 python3 -X faulthandler $R/trees/dbg.py $a > $O/run_${a// /_}.txt 2>&1; echo "rc=$? $a" >> $O/rcs.txt
done
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1); echo "cs=$CS" >> $O/rcs.txt
[ -n "$CS" ] && timeout 200 $CS --tool memcheck --print-limit 20 python3 $R/trees/dbg.py 64 256 16 > $O/memcheck.txt 2>&1; echo "memcheck rc=$?" >> $O/rcs.txt
cat $O/rcs.txt
