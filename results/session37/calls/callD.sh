#!/usr/bin/env bash
# Session 37, call D: steal as the default (next/steal tip, tree $STEAL). Torch W=1 tests (the
# phases test with steal, bitwise, worst-case, cached), nvshmem's one-PE tests (every one runs
# the alone kernels with the default), then a torch + nvshmem bench if time is left.
R=$PWD; O=$OUT; S=${STEAL:?set STEAL}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tt
tt $S td 150 '(fan_out_in_phases and steal) or (num_worst and 1-) or (bitwise_equal and 1-) or (cached and 1-)'
(cd $R/trees/$S && SYMMOE_COMMIT=$S OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=200 FAULT_S=190 \
  PYTEST_ARGS="-rA -k 'one_pe or (bitwise and 1) or (cached and 1) or (worst and 1)'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem D" n; echo "t=$SECONDS"
[ $SECONDS -lt 380 ] && b $S d1
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
