#!/usr/bin/env bash
# session 35, call B: next/nv-routed 3f7a0e2 (nvshmem at one PE routes inside its data kernel through symmoe_cuda's
# alone_routed, both layouts; the nvshmem tail's counts_late) against main aad28ee (rows-routed merged).
# nvshmem tests (one PE, every worst-case test), torch routes_inside (its path check moved to symmoe.testing),
# benches NV / M / NV.
R=$PWD; O=$OUT; NV=3f7a0e2; M=aad28ee
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$NV && export SYMMOE_COMMIT=$NV
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=240 FAULT_S=230 PYTEST_ARGS="-rA -k 'one_pe or routes_inside or (bitwise and 1) or (cached and 1) or worst or (summary and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1
s "nvshmem nv-routed" n; echo "t=$SECONDS"
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=100 FAULT_S=90 PYTEST_ARGS="-rA -k 'routes_inside'" scripts/gpu_check.sh test 2>&1 | tail -1
s "torch nv-routed" t; echo "t=$SECONDS"
b $NV nv1
b $M main1
[ $SECONDS -lt 530 ] && b $NV nv2
tar czf $O/logs.tar.gz -C /tmp/l n t 2>/dev/null
