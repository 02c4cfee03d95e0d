#!/usr/bin/env bash
# Session 53 call C: this session's host changes together (f51c43a: no slice that keeps every
# row, the W=1 result built before the wait, and the bench's stream looked up before the timed
# call) against the session's start (7ec258a) with only the bench's stream change (bc49432), so
# both trees time the same way. W=1 torch push benches change / base while the call has time.
#   BASE=<base tree> CHANGE=<change tree> LIMIT=<s> bash trees/callC.sh
R=$PWD; O=$OUT; M=${BASE:?set BASE}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-440}
b $C f1 torch; b $M b1 torch
for i in 2 3; do
  [ $SECONDS -lt $((L - 60)) ] && { b $C f$i torch; b $M b$i torch; }
done
ls=$(for l in f1 b1 f2 b2 f3 b3; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$C python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz *.json && rm -f *.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -4 $O/compare.txt; grep -A4 "host after" $O/compare.txt
