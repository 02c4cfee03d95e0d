#!/usr/bin/env bash
# session 35, call C: next/nv-routed 3f7a0e2 again: the nvshmem bad-id tests B's limit cut (one PE: the routed
# path's bad id and capacity; W=2 with num_worst_tokens), then benches NV / M / NV / M (B's exact-size nvshmem
# dispatch read 205-223 µs against 158 with the kernel 8 µs faster: its after-wait host time, or the lease?).
R=$PWD; O=$OUT; NV=3f7a0e2; M=aad28ee
. "$R/results/session34/calls/next_lib.sh"  # b, s
cd $R/trees/$NV && export SYMMOE_COMMIT=$NV
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=150 FAULT_S=140 PYTEST_ARGS="-rA -k 'bad_expert_id or over_capacity'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1
s "nvshmem nv-routed" n; echo "t=$SECONDS"
b $NV nv3
b $M main2
[ $SECONDS -lt 460 ] && b $NV nv4
[ $SECONDS -lt 520 ] && b $M main3
tar czf $O/logs.tar.gz -C /tmp/l n 2>/dev/null
