#!/usr/bin/env bash
# session 31 call A: main 07a1f41 (code = 65a025e): multi-step routing, counts, nvshmem subset; then the stamps probe
R=$PWD; O=$OUT; export SYMMOE_COMMIT=07a1f41
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=230 FAULT_S=220 PYTEST_ARGS="-k 'many_steps or many_chunks or summary or (bitwise_equal and (1- or 2-))'" scripts/gpu_check.sh build test 2>&1 | tail -6
cp /tmp/o/t/summary.txt $O/tests_torch.txt
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=110 FAULT_S=100 PYTEST_ARGS="-k 'bitwise or summary or bad'" scripts/gpu_check.sh nvshmem 2>&1 | tail -3
cp /tmp/o/n/summary.txt $O/tests_nvshmem.txt; tar czf $O/test_logs.tar.gz -C /tmp/l t n
cd $R/trees/3625403 && SYMMOE_COMMIT=3625403 OUT=/tmp/o/p LOG=/tmp/l/p scripts/gpu_check.sh build 2>&1 | tail -2
timeout 120 python3 scripts/route_stamps_probe.py > $O/stamps.txt 2>&1; tail -3 $O/stamps.txt
