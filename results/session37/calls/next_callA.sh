#!/usr/bin/env bash
# Prepared in session 37 for the next GPU session (not run): the tests that did not run with
# kernel.fan_phases=steal as the default (main since a3920d5). Tree: scripts/baseline_tree.sh main;
# run with MAIN=<its hash>. Torch: bad ids / capacity (the steal counter must be zero after a
# raise: the next dispatch moves the reference's rows), the routed kernel, the steal tests; then
# nvshmem's one-PE tests the 200 s limit cut in session 37 D; then nccl's (W=1, its own script).
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"  # s, tt
tt $M ta 150 'alone_bad or routes_inside or steal or routed_kernel'
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=220 FAULT_S=210 \
  PYTEST_ARGS="-rA -k 'one_pe_bad or one_pe_dispatch_routes or summary'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1)
s "nvshmem one-PE" n; echo "t=$SECONDS"
(cd $R/trees/$M && SYMMOE_COMMIT=$M OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh build nccl 2>&1 | tail -1)
s "nccl" c; grep -h "passed\|failed" /tmp/l/c/nccl_tests.log >> $O/summaries.txt 2>/dev/null
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
