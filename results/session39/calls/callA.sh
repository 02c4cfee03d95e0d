#!/usr/bin/env bash
# Session 39 call A: run as committed in session 38 (results/session38/calls/next_callA.sh) with MAIN=c1b0b11.
# Prepared in session 38 for the next GPU session (not run): the tests that did not run on
# 7a93807 (RouteScratch::sums, the expert-major routed kernel's plan from the chunks' added
# counts). Tree: scripts/baseline_tree.sh main; run with MAIN=<its hash>. Torch: the steal and
# phased fan-out tests (every fan_phases mode routes through the routed kernel at W=1), bitwise,
# worst-case and cached at W=1; nvshmem's one-PE tests and the summary; then nccl's 15 (W=1, the
# same Context and kernels).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # s, tt, tn
tt $M ta 220 'steal or phases or (bitwise_equal and 1-) or (num_worst and 1-) or (cached and 1-)'
tn $M n 150 'one_pe or summary'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh build nccl 2>&1 | tail -1)
s "nccl" c; grep -h "passed\|failed" /tmp/l/c/nccl_tests.log >> $O/summaries.txt 2>/dev/null
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
