#!/usr/bin/env bash
# Session 37, call C: kernel.fan_phases=steal (next/steal, tree $STEAL; main + the rows-by-ticket
# patch + the steal). Torch tests of the steal and the routed kernel, the routed timeline with
# block and steal, torch + nvshmem benches block / steal / block / steal.
R=$PWD; O=$OUT; S=${STEAL:?set STEAL}
. "$R/results/session34/calls/next_lib.sh"  # b, s, tl, tt
tt $S ts 200 'steal or (routes_inside and 132) or alone_bad or (cached and 1-) or timeline'
TIMELINE_VARIANTS='kernel.fan_phases=steal' tl $S ls
for v in block steal block steal; do
  [ $SECONDS -lt 520 ] && BENCH_SET="kernel.fan_phases=$v" b $S $v-$SECONDS
done
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
