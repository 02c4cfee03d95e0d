#!/usr/bin/env bash
# The source tree of another commit under trees/<commit>/ (ignored by git),
# so that one call on the GPU machine measures a change and its baseline on the same lease:
#
#   scripts/baseline_tree.sh main            # prints the folder, e.g. trees/1a7e89e
#   scripts/baseline_tree.sh REV DIR         # DIR/<commit> instead (relative to the repository)
#   device command (carry [".whl", "trees"]):
#     <pip line of gpu-wheels.sh>; O=$OUT;
#     SYMMOE_COMMIT=<this commit> OUT=$O/new LOG=/tmp/ln scripts/gpu_check.sh build bench;
#     (cd trees/1a7e89e && SYMMOE_COMMIT=1a7e89e OUT=$O/base LOG=/tmp/lb scripts/gpu_check.sh build bench)
#
# gpu_check.sh installs the tree it runs from (pip install -e), so the baseline runs last or the
# change's sections after it reinstall first. The kernels build into one cache keyed by their
# sources: the two trees never share a build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: scripts/baseline_tree.sh REV [DIR]" >&2; exit 2; }
rev=$(git rev-parse --short "$1^{commit}") || { echo "baseline_tree.sh: '$1' is not a commit here" >&2; exit 2; }
dir=${2:-trees}/$rev
rm -rf "$dir"
mkdir -p "$dir"
git archive "$rev" | tar -x -C "$dir"
echo "$dir"
