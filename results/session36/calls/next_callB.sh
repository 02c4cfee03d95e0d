#!/usr/bin/env bash
# Prepared in session 36 (not run): the trees of next_callA.sh; nvshmem's one-PE tests on V4 (it runs the same
# routed kernel through alone_routed), then torch + nvshmem benches P / M / P.
R=$PWD; O=$OUT; P=${PATCHED:?set PATCHED}; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # b, s
(cd $R/trees/$P && SYMMOE_COMMIT=$P OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=240 FAULT_S=230 \
  PYTEST_ARGS="-rA -k 'one_pe or (bitwise and 1) or (cached and 1) or (worst and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem v4" n; echo "t=$SECONDS"
b $P p1n; b $M main1n
[ $SECONDS -lt 500 ] && b $P p2n
tar czf $O/logs.tar.gz -C /tmp/l n 2>/dev/null
