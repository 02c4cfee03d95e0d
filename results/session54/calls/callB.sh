#!/usr/bin/env bash
# Session 54 call B: the bench releasing each timed call's result after its end event (CHANGE)
# against the C++ counts wait alone (MAIN): W=1 torch push benches c / e in turns, and the
# nccl section (its W=1 tests and bench) on CHANGE, which binds CountsWait in a third module.
#   MAIN=<base tree> CHANGE=<change tree> LIMIT=<s> bash trees/callB.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-520}
b $C c1 torch; b $M e1 torch; b $C c2 torch; b $M e2 torch
(cd $R/trees/$C && SYMMOE_COMMIT=$C OUT=/tmp/o/nccl LOG=/tmp/l/nccl TEST_LIMIT_S=100 timeout 185 scripts/gpu_check.sh build nccl 2>&1 | tail -3)
cp /tmp/o/nccl/summary.txt $O/nccl_summary.txt 2>/dev/null; cp /tmp/l/nccl/nccl_bench.json $O/ 2>/dev/null
grep -h '^PASSED\|^FAILED\|^ERROR' /tmp/l/nccl/*tests.log >> $O/nccl_summary.txt 2>/dev/null
echo "nccl t=$SECONDS"
[ $SECONDS -lt $((L - 70)) ] && { b $C c3 torch; b $M e3 torch; }
ls=$(for l in c1 e1 c2 e2 c3 e3; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz bench_*.json && rm -f bench_*.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -12 $O/compare.txt; grep -A4 "host after" $O/compare.txt; head -5 $O/nccl_summary.txt
