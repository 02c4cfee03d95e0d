#!/usr/bin/env bash
# Prepared in session 36 (not run): the trees of next_callA.sh; nvshmem's one-PE tests on V (it runs the same
# routed kernel through alone_routed), then torch + nvshmem benches V / R / V.
R=$PWD; O=$OUT; RT=${ROWS:?set ROWS}; V=${V4:?set V4}
. "$R/results/session34/calls/next_lib.sh"  # b, s
(cd $R/trees/$V && SYMMOE_COMMIT=$V OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=240 FAULT_S=230 \
  PYTEST_ARGS="-rA -k 'one_pe or (bitwise and 1) or (cached and 1) or (worst and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem V" n; echo "t=$SECONDS"
b $V v1n; b $RT r1n
[ $SECONDS -lt 500 ] && b $V v2n
tar czf $O/logs.tar.gz -C /tmp/l n 2>/dev/null
