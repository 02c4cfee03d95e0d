#!/usr/bin/env bash
# prepared in session 34 for the next GPU session (not run). Trees: scripts/baseline_tree.sh next/nv-routed;
# scripts/baseline_tree.sh main; run with MAIN=<main's tree name>.
# next/nv-routed 83b2c11: nvshmem at one PE runs the expert-major dispatch that routes as alone_fan_routed_kernel
# (symmoe_cuda's alone_routed). nvshmem one-PE tests, then benches nv-routed / main twice (nvshmem expert dispatch).
R=$PWD; O=$OUT; NV=83b2c11; M=${MAIN:?set MAIN to the tree name of main}
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$NV && export SYMMOE_COMMIT=$NV
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=200 FAULT_S=190 PYTEST_ARGS="-rA -k 'one_pe or (bitwise and 1) or (cached and 1) or (num_worst and 1) or (summary and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1
s "nvshmem nv-routed" n; echo "t=$SECONDS"
b $NV nv1
b $M main1
[ $SECONDS -lt 480 ] && b $NV nv2
[ $SECONDS -lt 530 ] && b $M main2
tar czf $O/logs.tar.gz -C /tmp/l .
