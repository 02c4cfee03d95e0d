#!/usr/bin/env bash
# Session 49 call Q (the last ~380 device seconds): main's multi-rank paths after session 47's
# routing change (route_chunk on a team; route_kernel and the NVSHMEM plan kernel run it with the
# whole block): torch bitwise at 2 and 4 processes, push, hidden 256, and the routing split over
# many chunks at 2; nvshmem bitwise at 2, 4 and 8 PEs. Under MPS on one H200.
#   MAIN=<main tree> bash trees/callQ.sh
R=$PWD; O=$OUT; M=${MAIN:?set MAIN}
. "$R/results/session34/calls/next_lib.sh"
need_trees $M
tt $M t 90 '((bitwise_equal_to_reference and push and 256 and (2 or 4)) or (routing_split and push and 2)) and not streamed'
tn $M n 80 'bitwise and (2 or 4 or 8)'
tar czf $O/logs.tar.gz -C /tmp/l . 2>/dev/null
