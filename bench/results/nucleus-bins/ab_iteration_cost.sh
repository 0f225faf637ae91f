#!/usr/bin/env bash
# sampled-rows/iteration_cost.py at a base commit and at this checkout, taking turns, three runs each: a call's cost
# greedy, at T = 1 and at T = 0.7 / top-p 0.95 (the issue's "cheaper bets" target is the last within a few percent
# of the first). The base is a worktree with its native module built in place, imported first by PYTHONPATH.
#     bash ab_iteration_cost.sh BASE [ENGINES]     (from this folder, the package's venv active; ENGINES: those
#                                                   iteration_cost.py names, default packed and ar)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=/tmp/packed-ss-base
git -C "$here" worktree add -f "$base" "$1" -q 2>/dev/null || git -C "$base" checkout -q "$1"
(cd "$base" && PACKED_SS_REQUIRE_NATIVE=1 python setup.py -q build_ext --inplace > /dev/null)
script="$here/../sampled-rows/iteration_cost.py"
for run in 1 2 3; do
    echo "== base $1, run $run"; (cd /tmp && PYTHONPATH="$base" python "$script" "${@:2}")
    echo "== this checkout, run $run"; (cd /tmp && python "$script" "${@:2}")
done
