#!/usr/bin/env bash
# Session 52 call D: when the exact-size W=1 rank-major dispatch hands the counts to the host, on
# the device's clock (the routed kernel's stamped build; the last ticket's "built" mark), on
# next/route-first and on main: scripts/timeline_probe.py --routed --exact from this checkout,
# run against each tree's installed package.   MAIN=<main tree> CHANGE=<branch tree> bash trees/callD.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}; C=${CHANGE:?set CHANGE}
for t in $C $M; do
  [ -d $R/trees/$t ] || { echo "no tree $t"; exit 2; }
  (cd $R/trees/$t && SYMMOE_COMMIT=$t OUT=/tmp/o/$t LOG=/tmp/l/$t scripts/gpu_check.sh build 2>&1 | tail -1
   SYMMOE_COMMIT=$t timeout 60 python3 $R/scripts/timeline_probe.py --backends torch --protocols push --layouts rank \
     --routed --exact --repeats 9 --json $O/timeline_exact_$t.json > $O/timeline_exact_$t.txt 2>&1; tail -25 $O/timeline_exact_$t.txt)
  echo "$t t=$SECONDS"
done
