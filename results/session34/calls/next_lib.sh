# The helpers of next_callA/B/C.sh (sourced; R: the repository root, O: the device tool's $OUT).
b() { # tree label [backends]: build + bench W=1 push (torch,nvshmem unless named), 20 repeats
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 BENCH_WORLD_SIZES=1 BENCH_BACKENDS=${3:-torch,nvshmem} BENCH_PROTOCOLS=push BENCH_REPEATS=20 \
    OUT=/tmp/o/$2 LOG=/tmp/l/$2 scripts/gpu_check.sh build bench 2>&1 | tail -1; cp /tmp/l/$2/bench.json $O/bench_$2.json); echo "$2 t=$SECONDS"; }
s() { # title label: that run's summary and its tests' PASSED / FAILED lines into summaries.txt
  (echo "== $1"; cat /tmp/o/$2/summary.txt; grep -h '^PASSED\|^FAILED\|^ERROR' /tmp/l/$2/*tests.log /tmp/l/$2/pytest.log 2>/dev/null) >> $O/summaries.txt; }
tl() { # tree label: the routed kernel's timeline (torch push, both layouts) into timeline_<label>.json and summaries.txt
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TIMELINE_ROUTED=1 TIMELINE_BACKENDS=torch BENCH_PROTOCOLS=push \
    scripts/gpu_check.sh timeline 2>&1 | tail -1; cp /tmp/l/$2/timeline.json $O/timeline_$2.json; (echo "== timeline $2"; cat /tmp/l/$2/timeline.txt) >> $O/summaries.txt); echo "$2 t=$SECONDS"; }
tt() { # tree label limit_s expr: build + the torch GPU tests matching -k expr, their lines into summaries.txt
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TEST_LIMIT_S=$3 FAULT_S=$(($3 - 10)) \
    PYTEST_ARGS="-rA -k '$4'" scripts/gpu_check.sh build test 2>&1 | tail -1); s "torch tests $2" $2; echo "$2 t=$SECONDS"; }
tn() { # tree label limit_s expr: build + the nvshmem GPU tests matching -k expr, their lines into summaries.txt (session 38)
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 TEST_LIMIT_S=$3 FAULT_S=$(($3 - 10)) \
    PYTEST_ARGS="-rA -k '$4'" scripts/gpu_check.sh build nvshmem 2>&1 | tail -1); s "nvshmem tests $2" $2; echo "$2 t=$SECONDS"; }
need_trees() { # tree...: stop the call before any device work when a tree is missing (session 39: GROUPS=<hash>
  # is ignored by bash, so its call benched main alone)
  for t in "$@"; do [ -d "$R/trees/$t" ] || { echo "no tree trees/$t" | tee -a $O/summaries.txt; exit 2; }; done; }
hp() { # tree label: the host probe (torch, nvshmem push; scripts/host_profile.py) into host_<label>.txt,
  # its before / after-wait lines into summaries.txt (session 40)
  (cd $R/trees/$1 && SYMMOE_COMMIT=$1 OUT=/tmp/o/$2 LOG=/tmp/l/$2 BENCH_BACKENDS=torch,nvshmem BENCH_PROTOCOLS=push \
    timeout 150 scripts/gpu_check.sh build host 2>&1 | tail -1; cp /tmp/l/$2/host_profile.txt $O/host_$2.txt)
  (echo "== host $2"; grep -A8 "before its counts wait" $O/host_$2.txt | grep "before\|of it"; grep -A4 "after its counts wait" $O/host_$2.txt | grep "after\|of it") >> $O/summaries.txt
  echo "$2 t=$SECONDS"; }
ab_benches() { # change main: benches change / main (c1, m1), then again (c2, m2) while the call has time (session 40)
  b $1 c1; b $2 m1
  [ $SECONDS -lt 470 ] && b $1 c2
  [ $SECONDS -lt 510 ] && b $2 m2; }
finish() { # tree label...: bench_compare (with the tree's code) of the labels' benches that ran into
  # compare.txt, the JSONs and logs packed, its head printed (session 54: the tail every call script wrote out)
  local t=$1; shift
  local ls; ls=$(for l in "$@"; do [ -f $O/bench_$l.json ] && printf "$l,"; done | sed 's/,$//')
  (cd $R && PYTHONPATH=$R/trees/$t python3 -m symmoe.bench_compare $(for l in ${ls//,/ }; do echo $O/bench_$l.json; done) --labels $ls > $O/compare.txt 2>&1)
  (cd $O && tar czf jsons.tar.gz bench_*.json && rm -f bench_*.json)
  tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
  head -12 $O/compare.txt; grep -A4 "host after" $O/compare.txt; }
