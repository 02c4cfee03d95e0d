#!/usr/bin/env bash
# session 35, call A: next/rows-routed b4b7bf0 (the W=1 rank-major dispatch that routes moves its rows in
# phases inside alone_fan_routed_kernel) and next/placed-all 5631b9f (on it: routing_placed one mark a thread)
# against main 4532a05. torch W=1 tests on placed-all (covers both), benches RP / R / M, RP again, nccl on RP.
R=$PWD; O=$OUT; RR=b4b7bf0; RP=5631b9f; M=4532a05
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$RP && export SYMMOE_COMMIT=$RP
OUT=/tmp/o/t LOG=/tmp/l/t TEST_LIMIT_S=200 FAULT_S=190 PYTEST_ARGS="-rA -k 'routes_inside or alone_bad or (bitwise_equal and 1-) or (num_worst and 1-) or (cached and 1-)'" scripts/gpu_check.sh build test 2>&1 | tail -1
s "torch placed-all (on rows-routed)" t; echo "t=$SECONDS"
b $RP placed1
b $RR rows1
b $M main1
[ $SECONDS -lt 440 ] && b $RP placed2
cd $R/trees/$RP
[ $SECONDS -lt 500 ] && { OUT=/tmp/o/c LOG=/tmp/l/c scripts/gpu_check.sh nccl 2>&1 | tail -1; s "nccl placed-all" c; echo "t=$SECONDS"; }
tar czf $O/logs.tar.gz -C /tmp/l t c 2>/dev/null
