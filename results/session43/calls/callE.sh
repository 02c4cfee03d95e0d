#!/usr/bin/env bash
# Session 43 E (warm, no MPS daemon, the last ~190 s of the budget): symmoe ab v1_v2_mega at W=1 on
# next/host, then on main. The first was cut by its own 80 s limit (exit 124, no table); main's ran.
for t in 2fdb026 f940bda; do (cd trees/$t && timeout 85 python3 -m pip install -q -e . --no-deps --no-build-isolation >/dev/null 2>&1; timeout 80 python3 -m symmoe.ab configs/ab/v1_v2_mega.yaml --world-size 1 --repeats 20 --out $OUT/ab_$t --no-fallback > /tmp/ab_$t.log 2>&1; echo "$t exit $?"; grep "^| v\|^| mega" $OUT/ab_$t/table.md | head -3); rm -f $OUT/ab_$t/plot.png; done
