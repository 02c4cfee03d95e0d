#!/usr/bin/env bash
# Session 54 call C: the exact-size W=1 rank dispatch with its routing blocks moving rows from
# the start (3cee3cd-mf: 3cee3cd with OwnRouting::route_first false, as num_worst_tokens runs;
# the counts then reach the host near 29 µs instead of 12) against 3cee3cd (route first), now
# that the host's work after the wait is 1.5-3.3 µs (B). W=1 torch push benches v / c in turns.
#   MAIN=<base tree> CHANGE=<variant tree> LIMIT=<s> bash trees/callC.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M $C
L=${LIMIT:-400}
b $C v1 torch; b $M c1 torch
for i in 2 3; do
  [ $SECONDS -lt $((L - 60)) ] && { b $C v$i torch; b $M c$i torch; }
done
ls=$(for l in v1 c1 v2 c2 v3 c3; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
(cd $R && PYTHONPATH=$R/trees/$M python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
(cd $O && tar czf jsons.tar.gz bench_*.json && rm -f bench_*.json)
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
head -12 $O/compare.txt; grep -A4 "host after" $O/compare.txt
