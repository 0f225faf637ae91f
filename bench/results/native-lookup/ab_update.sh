#!/usr/bin/env bash
# ../native-statistics/update_parts.py (greedy, then T = 1) at a base commit and at this checkout, taking turns,
# two runs each; the base a worktree with its native module built in place.      bash ab_update.sh BASE
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../native-statistics/update_parts.py"
base=/tmp/packed-ss-base
git -C "$here" worktree add -f "$base" "$1" -q 2>/dev/null || git -C "$base" checkout -q "$1"
(cd "$base" && PACKED_SS_REQUIRE_NATIVE=1 python setup.py -q build_ext --inplace > /dev/null)
for run in 1 2; do
    for T in 0 1; do
        echo "== base $1, T = $T, run $run"; (cd /tmp && PYTHONPATH="$base" python "$script" $T)
        echo "== this checkout, T = $T, run $run"; (cd /tmp && python "$script" $T)
    done
done
