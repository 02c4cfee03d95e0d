#!/usr/bin/env bash
# session 32 call E: main 9be6f40 (code of e330c27): whole torch suite, nccl W=1 (tests+bench), nvshmem absent/memory
R=$PWD; O=$OUT; export SYMMOE_COMMIT=9be6f40
OUT=/tmp/o/e LOG=/tmp/l/e TEST_LIMIT_S=370 FAULT_S=200 scripts/gpu_check.sh build test nccl 2>&1 | tail -4
cp /tmp/o/e/summary.txt $O/summary_e.txt; cp /tmp/l/e/nccl_bench.json $O/ 2>/dev/null
left=$((560 - SECONDS)); echo "left $left s"
if [ $left -gt 90 ]; then
OUT=/tmp/o/n LOG=/tmp/l/n TEST_LIMIT_S=$((left-20)) FAULT_S=$((left-30)) PYTEST_ARGS="-k 'absent or memory'" scripts/gpu_check.sh nvshmem 2>&1 | tail -2
cp /tmp/o/n/summary.txt $O/summary_n.txt
fi
tar czf $O/logs.tar.gz -C /tmp/l .
