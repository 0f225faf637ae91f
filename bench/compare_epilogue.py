"""Non-model time per iteration of two source trees side by side: `bench/epilogue.py` run on each tree in
alternating rounds (so drifting machine load hits both alike), medians per cell and of the differences.

    python bench/compare_epilogue.py --before /path/to/old/checkout --after . --rounds 3

Each tree must import as `packed_ss` from its root (the native epilogue built or copied in place, and
`packed_ss/kernels` present, as in an editable install).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(tree: Path, out: Path, bench_args: list[str]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, str(tree / "bench" / "epilogue.py"), *bench_args, "--out", str(out)],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["records"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the reference tree")
    parser.add_argument("--after", type=Path, default=Path("."), help="the tree under test (default: .)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per tree (default 3)")
    parser.add_argument("bench_args", nargs="*", default=["--vocab", "1024", "32000", "131072", "--iters", "60"],
                        help="arguments for bench/epilogue.py (after --)")
    args = parser.parse_args(argv)
    times: dict[str, dict[tuple, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in ("before", "after"):
                for rec in run(getattr(args, name).resolve(), Path(tmp) / f"{name}-{r}.json", args.bench_args):
                    key = (rec["schedule"], rec["vocab"], rec["sampling"], rec["epilogue"])
                    times[name].setdefault(key, []).append(rec["us_per_iter"])
    before = {k: statistics.median(v) for k, v in times["before"].items()}
    after = {k: statistics.median(v) for k, v in times["after"].items()}
    print("| schedule | vocab | sampling | epilogue | before µs | after µs | after / before |")
    print("|---|---:|---|---|---:|---:|---:|")
    for key in before:
        print(f"| {' | '.join(map(str, key))} | {before[key]:.1f} | {after[key]:.1f} | {after[key] / before[key]:.2f} |")
    print()
    for epilogue in sorted({k[3] for k in before}):
        for vocab in sorted({k[1] for k in before}):
            keys = [k for k in before if k[3] == epilogue and k[1] == vocab]
            diff = statistics.median(after[k] - before[k] for k in keys)
            ratio = math.exp(statistics.fmean(math.log(after[k] / before[k]) for k in keys))
            print(f"{epilogue:<7} vocab {vocab:>6}: median difference {diff:+.1f} µs, geometric mean ratio {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
