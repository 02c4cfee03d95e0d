#!/usr/bin/env bash
R=$PWD; O=$OUT
cd $R/trees/0f2c00f && SYMMOE_COMMIT=0f2c00f OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -3
python3 scripts/route_stamps_probe.py > $O/stamps.txt 2>&1; tail -3 $O/stamps.txt
cd $R && SYMMOE_COMMIT=42b3eea OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=330 FAULT_S=320 PYTEST_ARGS="-k 'absent or memory'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -12
cp /tmp/o/n/summary.txt $O/nv_summary.txt; tar czf $O/nv_logs.tar.gz -C /tmp/l n
