#!/usr/bin/env bash
# session 31 call B: finer route stamps (probe/route-stamps3 6aafb24); nvshmem bench main 07a1f41 vs next/nv-route-one 3e9c825; the branch's whole nvshmem suite
R=$PWD; O=$OUT
cd $R/trees/6aafb24 && SYMMOE_COMMIT=6aafb24 OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -1
timeout 100 python3 scripts/route_stamps_probe.py > $O/stamps3.txt 2>&1; tail -2 $O/stamps3.txt
cd $R && SYMMOE_COMMIT=07a1f41 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=nvshmem BENCH_REPEATS=20 OUT=/tmp/o/bm LOG=/tmp/l/bm scripts/gpu_check.sh build bench 2>&1 | tail -4
cp /tmp/l/bm/bench.json $O/bench_nv_main.json
cd $R/trees/3e9c825 && export SYMMOE_COMMIT=3e9c825
BENCH_WORLD_SIZES=1 BENCH_BACKENDS=nvshmem BENCH_REPEATS=20 OUT=/tmp/o/bb LOG=/tmp/l/bb scripts/gpu_check.sh build bench 2>&1 | tail -4
cp /tmp/l/bb/bench.json $O/bench_nv_branch.json
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=290 FAULT_S=280 scripts/gpu_check.sh nvshmem 2>&1 | tail -3
cp /tmp/o/n/summary.txt $O/nv_suite.txt; tar czf $O/logs.tar.gz -C /tmp/l n bm bb
