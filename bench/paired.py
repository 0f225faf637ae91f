"""The decode iteration of this tree against a baseline checkout (the commit before a change), paired, in one run.

    git worktree add /tmp/contiguous bb2dd7a        # e.g. the last commit before paging
    python bench/paired.py --baseline /tmp/contiguous --model smollm2-135m --dtype bfloat16 --out DIR
    python bench/paired.py --baseline /tmp/before --schedule ar --temperature 0.7 --top-p 0.95 --out DIR

Each round runs, in a process of its own for each tree and in alternating order, `iteration_cost` (the real
runtime's `generate_batch`, EOS off, minus the same call with one new token; greedy, or sampled with the given
settings and seed 0) for every batch size, so a drifting load hits both alike (with `--mixed`: the wall time per
generated token of B streamed requests of four sampling settings); the ratio tree / baseline of ms per iteration
is reported per batch size (median over rounds and a bootstrap 95% interval). This tree runs as
installed; the baseline imports from its checkout with this install's native epilogue (so a change to csrc/
is not what this compares).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, torch
import packed_ss
from packed_ss.lab.bench.iteration import iteration_cost
from packed_ss.model.loading import dtype_named
from packed_ss.model.sources import resolve_model
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
path = resolve_model(args["model"])
model = packed_ss.load_model(path, dtype=dtype_named(args["dtype"]), draft_adapter=None)
prompt = packed_ss.load_tokenizer(path).encode(args["prompt"]).ids
engine = packed_ss.Engine(model, schedule=args["schedule"], width=args["width"])


def mixed_ms_per_token(b):
    # b requests, sampling settings cycling through MIXED, streamed and consumed in turn as a server would
    import statistics, time
    def once():
        streams = [engine.stream(prompt, args["new"], eos_token_id=[], seed=i, **args["mixed"][i % len(args["mixed"])])
                   for i in range(b)]
        began, live = time.perf_counter(), list(streams)
        while live:
            live = [s for s in live if next(s, None) is not None]
        return 1e3 * (time.perf_counter() - began) / (b * args["new"])
    once()
    return statistics.median(once() for _ in range(args["repeats"]))


print(json.dumps({b: mixed_ms_per_token(b) if args["mixed"] else
                  iteration_cost(engine, [prompt] * b, args["new"], repeats=args["repeats"], **args["sampling"])[
                      "ms_per_iteration"] for b in args["batch_sizes"]}))
"""
MIXED = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.95), dict(temperature=0.8, top_k=50),
         dict(temperature=1.2, top_p=0.9)]
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def importable(tree: Path) -> Path:
    """A directory to put first on PYTHONPATH that imports `packed_ss` from `tree` as the install maps it (its
    entries, `kernels` beside them, and this tree's built native epilogue); the
    tree's root itself would shadow Hugging Face's `kernels` package. Nothing is written into `tree`."""
    root = Path(tempfile.mkdtemp(prefix="packed-ss-tree-"))
    package = root / "packed_ss"
    package.mkdir()
    for entry in (tree / "packed_ss").iterdir():
        if not entry.name.endswith(".so"):
            (package / entry.name).symlink_to(entry)
    (package / "kernels").symlink_to(tree / "kernels")
    for built in (HERE / "packed_ss").glob("_epilogue*.so"):
        (package / built.name).symlink_to(built)
    return root


def run(tree: Path, args) -> dict[str, float]:
    env = dict(os.environ) if tree == HERE else dict(os.environ, PYTHONPATH=str(importable(tree)))
    sampling = {} if not args.temperature else dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                                   seed=0)
    options = dict(model=args.model, dtype=args.dtype, threads=args.threads, schedule=args.schedule,
                   width=args.width, new=args.new, repeats=args.repeats, batch_sizes=args.batch_sizes, prompt=PROMPT,
                   sampling=sampling, mixed=MIXED if args.mixed else [])
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(options)], env=env, cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of the commit before the change")
    p.add_argument("--model", default=None, help="model directory, GGUF file or name (default: the shipped model)")
    p.add_argument("--dtype", default="auto", help="weights' dtype (default auto)")
    p.add_argument("--schedule", default="packed")
    p.add_argument("--width", type=int, default=7)
    p.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (default 0: greedy)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--mixed", action="store_true",
                   help="instead: ms per generated token of B requests streamed together whose sampling settings "
                        "cycle through MIXED (T = 1; 0.7 top-p 0.95; 0.8 top-k 50; 1.2 top-p 0.9), seeds 0..B-1")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--new", type=int, default=64, help="new tokens per request (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed pairs per process (default 3)")
    p.add_argument("--rounds", type=int, default=6, help="paired rounds (default 6)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    trees = {"tree": HERE, "baseline": args.baseline.resolve()}
    times = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            times[name].append(run(trees[name], args))
            print(f"round {r}: {name} {times[name][-1]}", file=sys.stderr)
    rng = np.random.default_rng(0)
    rows = []
    for b in map(str, args.batch_sizes):
        ratio = np.array([t[b] / c[b] for t, c in zip(times["tree"], times["baseline"])])
        boot = np.median(ratio[rng.integers(0, len(ratio), (20000, len(ratio)))], axis=1)
        rows.append({"batch": int(b), "tree_ms": float(np.median([t[b] for t in times["tree"]])),
                     "baseline_ms": float(np.median([t[b] for t in times["baseline"]])),
                     "ratio": float(np.median(ratio)), "lo": float(np.percentile(boot, 2.5)),
                     "hi": float(np.percentile(boot, 97.5))})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paired.json").write_text(json.dumps({"options": {k: str(v) for k, v in vars(args).items()},
                                                     "times": times, "rows": rows}, indent=1))
    unit = "ms/token" if args.mixed else "ms/iteration"
    lines = [f"| batch | baseline {unit} | tree {unit} | tree / baseline [95%] |", "|---|---:|---:|---|"]
    lines += [f"| {r['batch']} | {r['baseline_ms']:.2f} | {r['tree_ms']:.2f} | {r['ratio']:.3f} [{r['lo']:.3f}, "
              f"{r['hi']:.3f}] |" for r in rows]
    (args.out / "paired.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
