"""Decode iteration time of the shipped model at several batch sizes, per loop mode, and where the time goes.

For each mode (eager, compile, graph, graph+compile; the graph ones on CUDA only) and batch size B: B copies of
one prompt decode `--new` tokens each (EOS off) with `generate_batch`; time per iteration = (wall - the prefills'
wall, measured by the same call with one new token) / iterations. Then one more decode of the largest batch runs
under torch.profiler and the busiest kernels (device time) or ops (CPU) are printed.

    python bench/iteration.py --device cuda --batch-sizes 1 8 32 --out iteration.json      # GPU stage
    python bench/iteration.py --modes eager compile --batch-sizes 1 8                      # CPU
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import packed_ss
from packed_ss.lab.bench.iteration import iteration_cost, timed

MODES = {"eager": {}, "compile": dict(compile=True), "graph": dict(cuda_graph=True),
         "graph+compile": dict(cuda_graph=True, compile=True)}
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", nargs="+", default=None, choices=list(MODES),
                        help="default: every mode the device has")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new", type=int, default=64, help="new tokens per request")
    parser.add_argument("--width", type=int, default=3)
    parser.add_argument("--top", type=int, default=15, help="profiled kernels / ops printed")
    parser.add_argument("--out", default=None, help="JSON file for the records")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    modes = args.modes or [m for m in MODES if device.type == "cuda" or "graph" not in m]
    model = packed_ss.load_model(device=device)
    prompt = packed_ss.load_tokenizer().encode(PROMPT).ids
    records = []
    for mode in modes:
        engine = packed_ss.Engine(model, schedule="packed", width=args.width, **MODES[mode])
        for batch in args.batch_sizes:
            cost = iteration_cost(engine, [prompt] * batch, args.new)
            records.append(dict(mode=mode, batch=batch, **cost))
            print(f"{mode:<14} batch {batch:>3}: {cost['ms_per_iteration']:7.3f} ms/iteration ({cost['iterations']} "
                  f"iterations, prefill {cost['prefill_share']:.0%} of the wall, {engine.epilogue} epilogue)",
                  flush=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            timed(engine, [prompt] * args.batch_sizes[-1], args.new)
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"-- {mode}, batch {args.batch_sizes[-1]}: the busiest {args.top} by {key}")
        print(prof.key_averages().table(sort_by=key, row_limit=args.top))
        if args.out:
            Path(args.out).write_text(json.dumps(dict(device=str(device), records=records), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
