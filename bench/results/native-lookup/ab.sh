#!/usr/bin/env bash
# iteration_cost.py at a base commit and at this checkout, taking turns, three runs each. The base is a worktree with
# its native module built in place, imported first by PYTHONPATH.
#     bash ab.sh BASE          (from this folder, the package's venv active)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=/tmp/packed-ss-base
git -C "$here" worktree add -f "$base" "$1" -q 2>/dev/null || git -C "$base" checkout -q "$1"
(cd "$base" && PACKED_SS_REQUIRE_NATIVE=1 python setup.py -q build_ext --inplace > /dev/null)
for run in 1 2 3; do
    echo "== base $1, run $run"; (cd /tmp && PYTHONPATH="$base" python "$here/iteration_cost.py")
    echo "== this checkout, run $run"; (cd /tmp && python "$here/iteration_cost.py")
done
