#!/usr/bin/env bash
# Session 48 call K: where the W=1 expert-major routed kernel waits between its routing's sums
# (complete near 9.5 µs in session 47's F) and round 0's first store (18.4 µs): next/diag's finer
# stamps (built: the sums seen; counted: the totals read and the readers' atomic back; walked:
# round 0's placed mark seen; scanned: its ids / weights / positions loaded), then nccl's W=1
# bench on main (not benched since session 47's change).
#   MAIN=<main tree> DIAG=<next/diag tree> bash trees/callK.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; D=${DIAG:?set DIAG}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $D
tl $D diag
b $M nccl nccl
(cd $R/trees/$M && echo "== nccl tests" && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 SYMMOE_CACHE=/tmp/symmoe-cache \
  timeout -s INT $((560 - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_nccl.py -k 'num_worst or dispatch_combine_bitwise' 2>&1 \
  | grep -E '^(PASSED|FAILED|ERROR)|passed|failed' | tail -8) >> $O/summaries.txt; echo "nccl tests t=$SECONDS"
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
