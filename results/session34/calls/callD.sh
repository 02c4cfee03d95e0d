#!/usr/bin/env bash
# session 34, call D (debug): fan_phases off (the old path: passes), then python -m trace of the fused path.
# Result: the last line traced is the call of ctx.route_alone: the process ends inside C++.
R=$PWD; O=$OUT
cd $R/trees/b18f193 && export SYMMOE_COMMIT=b18f193
MPS=off OUT=/tmp/o/b LOG=/tmp/l/b scripts/gpu_check.sh build 2>&1 | tail -1
export PYTHONUNBUFFERED=1 SYMMOE_CACHE=/tmp/symmoe-cache
IGN=$(python3 -c 'import sysconfig,torch,os;print(":".join([sysconfig.get_paths()["stdlib"],sysconfig.get_paths()["purelib"],os.path.dirname(os.path.dirname(torch.__file__)),"/tmp/site"]))')
echo "ign=$IGN" > $O/d.txt
SYMMOE_DBG_PHASES=off timeout 60 python3 $R/trees/dbg.py 64 256 16 >> $O/d.txt 2>&1; echo "rc off=$?" >> $O/d.txt
CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 -m trace --trace --ignore-dir=$IGN $R/trees/dbg.py 64 256 16 > /tmp/trace.txt 2>&1; echo "rc trace=$?" >> $O/d.txt
tail -80 /tmp/trace.txt >> $O/d.txt
