#!/usr/bin/env bash
# Prepared in session 35 for the next GPU session (not run); the tree of next_callA.sh (PATCHED=<its name>).
# torch W=1 tests (the routed kernel in both layouts, its stamped build, bad ids), nccl, then the routed
# kernel's timeline in both layouts: where its time over the cached dispatch goes (timeline.ROUTED_PHASES and
# each mark on the grid's clock).
R=$PWD; O=$OUT; P=${PATCHED:?set PATCHED}
. "$R/results/session34/calls/next_lib.sh"  # s
cd $R/trees/$P && export SYMMOE_COMMIT=$P
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=200 FAULT_S=190 PYTEST_ARGS="-rA -k 'routes_inside or timeline or alone_bad or (num_worst and 1-) or (cached and 1-) or (bitwise_equal and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch s35 patches" t; echo "t=$SECONDS"
OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh nccl 2>&1 | tail -1; s "nccl s35 patches" c; echo "t=$SECONDS"
OUT=/tmp/o/tl LOG=/tmp/l/tl TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push scripts/gpu_check.sh timeline 2>&1 | tail -1
cp /tmp/l/tl/timeline.json $O/timeline_routed.json; cat /tmp/l/tl/timeline.txt >> $O/summaries.txt; echo "t=$SECONDS"
[ $SECONDS -lt 470 ] && { OUT=/tmp/o/tc LOG=/tmp/l/tc TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push scripts/gpu_check.sh timeline 2>&1 | tail -1;
  cp /tmp/l/tc/timeline.json $O/timeline_cached.json; cat /tmp/l/tc/timeline.txt >> $O/summaries.txt; }
tar czf $O/logs.tar.gz -C /tmp/l t c tl tc 2>/dev/null
