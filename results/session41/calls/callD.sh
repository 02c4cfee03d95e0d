#!/usr/bin/env bash
# Session 41 D: next/diag (next/host with the chunk's marks moved: "walked" = tables zeroed,
# "scanned" = the first step of 32 pairs done), the routed timeline only: is C's 3.1 µs count walk
# the first step's loads, or the zeroing before it? Run with DIAG=<its tree>.
R=$PWD; O=$OUT; D=${DIAG:?set DIAG}
. "$R/results/session34/calls/next_lib.sh"
need_trees $D
tl $D dt
