"""Adaptive benchmark: the default engine (schedule "adaptive") against AR and the best fixed configuration.

    python -m packed_ss bench-adaptive --out DIR [options]
    python -m packed_ss bench-adaptive --quick --out DIR        (a few minutes)

For every sampling setting (greedy; T = 0.7 with top-p 0.95; T = 1) and batch size, HumanEval prompts are cut into
units of one batch each (with `--queue N`, of N batches' worth that run at most a batch at once, the others waiting
for a slot, as in a loaded server), and every unit is decoded by every method in a rotating order (paired unit by
unit; sampled requests carry a seed per prompt, so each method sees the same requests). The best fixed
configuration of each cell (setting, batch size) is picked first by a sweep over the candidates (fixed schedules
and widths, each with its default sampler) on other prompts than the ones it is scored on. Reported per cell:
throughput of each method, tokens per call, and the ratios default / AR and default / best fixed with paired
bootstrap 95% intervals over the units (stats.py); with `--samplers rejection gumbel` the default engine under the
other sampler too, at temperature > 0 (the choice of the default sampler). A streamed request of the default engine
is traced (the shape of each iteration and the tokens it emitted) and plotted. Writes DIR/adaptive.json,
DIR/adaptive.md and DIR/adaptive-trace.png.
"""
from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ...decode.policy import QUIET
from ...decode.sampling import SamplingParams
from ...engine import SAMPLERS, Engine
from ...model.tokenizer import load_tokenizer
from ..humaneval import tokenized_prompts
from ..progress import progress
from .options import add_model_args, apply_preset, bench_parser, cpu_name, load_bench_model
from .report import pyplot
from .stats import bootstrap_counts, paired, per_prompt

SETTINGS = {"T=0": {}, "T=0.7,top-p=0.95": dict(temperature=0.7, top_p=0.95), "T=1": dict(temperature=1.0)}
# Fixed configurations swept for the best one: (schedule, width, drafts); "packed auto both" is the engine's
# default before the adaptive schedule.
CANDIDATES = [("packed", "auto", "both"), ("packed", 3, "diffusion"), ("packed", 3, "both"), ("packed", 8, "both"),
              ("lookup", 4, None), ("lookup", 8, None)]
FULL = dict(limit=64, sweep=32, max_new_tokens=128, batch_sizes=[1, 8, 32])
QUICK = dict(limit=8, sweep=8, max_new_tokens=32, batch_sizes=[1, 4])


@dataclass
class Record:
    setting: str
    batch: int
    method: str
    unit: int          # which batch of prompts
    tokens: int
    nfe: int
    wall_s: float

    @property
    def prompt(self) -> int:      # stats.per_prompt's unit of pairing
        return self.unit


def name(config) -> str:
    schedule, width, drafts = config
    return f"{schedule} W={width}" + (f" +{drafts}" if drafts and schedule != "lookup" else "")


def engines(model, configs, samplers=()) -> dict[str, Engine]:
    """The default engine, AR, each fixed configuration, and the default engine under each of `samplers` rather than
    its own choice ("default~gumbel": at temperature > 0 only, greedy decoding does not sample). AR is plain
    sampling, the peer a user would pick (the rejection rule's AR step draws from the row's truncated
    distribution), whatever sampler the model's profile names for drafting schedules."""
    made = {"default": Engine(model), "ar": Engine(model, schedule="ar", sampler="rejection")}
    made |= {f"default~{s}": Engine(model, sampler=s) for s in samplers}
    for config in configs:
        schedule, width, drafts = config
        made[name(config)] = Engine(model, schedule=schedule, width=width, drafts=drafts)
    return made


def decode_units(methods: dict[str, Engine], prompts, batch: int, setting: str, max_new: int, seed: int,
                 bar, queue: int = 1) -> list[Record]:
    """Every unit of `batch` x `queue` prompts (at most `batch` at once) by every method, the order rotating from
    unit to unit, after an untimed warm-up of each method at this setting (it builds the setting's program: the
    adaptive one measures its shapes' costs then)."""
    records, names = [], list(methods)
    for engine in methods.values():
        engine.generate_batch(prompts[:batch], 4, seed=seed, batch_size=batch, **SETTINGS[setting])
    for unit, start in enumerate(range(0, len(prompts), batch * queue)):
        chunk = prompts[start:start + batch * queue]
        seeds = [seed + start + i for i in range(len(chunk))]
        for k in range(len(names)):
            method = names[(unit + k) % len(names)]
            t0 = time.perf_counter()
            results = methods[method].generate_batch(chunk, max_new, seed=seeds, batch_size=batch,
                                                     **SETTINGS[setting])
            wall = time.perf_counter() - t0
            records.append(Record(setting, batch, method, unit, sum(len(r.tokens) for r in results),
                                  sum(r.nfe for r in results), wall))
            bar.update(len(chunk))
    return records


def throughput(records) -> float:
    return sum(r.tokens for r in records) / sum(r.wall_s for r in records)


def trace(engine: Engine, prompt: list[int], max_new: int, seed: int) -> list[dict]:
    """One streamed request of `engine`: per iteration, the shape it ran and the tokens it emitted. On the CPU
    the scheduler runs an iteration in the shape the table just read chose, and hands out the tokens of the
    one before, so the shape seen at a chunk is the next chunk's."""
    params = SamplingParams(temperature=1.0)
    scheduler = engine.runtime.scheduler(engine.program(params))
    shapes, chunks = [], []
    for tokens in engine.stream(prompt, max_new, temperature=1.0, seed=seed, eos_token_id=[]):
        chunks.append(len(tokens))
        shapes.append(scheduler.shape)
    policy = engine.program(params).policy
    named = {i: (str(s), s.rows) for i, s in enumerate(policy.shapes)} | {QUIET: ("ar (quiet)", 1)}
    return [{"iteration": i, "shape": named[shapes[i - 1]][0], "rows": named[shapes[i - 1]][1], "tokens": n}
            for i, n in enumerate(chunks) if i > 0]


def run(args) -> dict:
    path, model = load_bench_model(args)
    tokenized = [ids for _, ids in tokenized_prompts(load_tokenizer(path), args.sweep + args.limit)]
    sweep, scored = tokenized[:args.sweep], tokenized[args.sweep:]
    configs = [CANDIDATES[i] for i in args.candidates]
    candidates = engines(model, configs, args.samplers)
    others = [n for n in candidates if n.startswith("default~")]
    sampled = [s for s in args.settings if SETTINGS[s]]
    total = len(args.batch_sizes) * (len(args.settings) * (len(configs) * len(sweep) + 3 * len(scored))
                                     + len(sampled) * len(others) * len(scored))
    bar = progress(total=total, desc="requests")
    swept, records, best = [], [], {}
    for setting in args.settings:
        for batch in args.batch_sizes:
            fixed = {n: e for n, e in candidates.items() if n not in ["default", "ar"] + others}
            trial = decode_units(fixed, sweep, batch, setting, args.max_new_tokens, args.seed + 10_000, bar,
                                 args.queue)
            swept += trial
            best[(setting, batch)] = max(fixed, key=lambda n: throughput([r for r in trial if r.method == n]))
            chosen = {n: candidates[n] for n in ["default", "ar", best[(setting, batch)]]
                      + (others if setting in sampled else [])}
            records += decode_units(chosen, scored, batch, setting, args.max_new_tokens, args.seed, bar, args.queue)
    bar.close()
    cells = []
    for (setting, batch), fixed in best.items():
        rows = [r for r in records if r.setting == setting and r.batch == batch]
        units = max(r.unit for r in rows) + 1
        counts = bootstrap_counts(units, args.resamples, args.seed)
        ran = [m for m in ["default", "ar", fixed] + others if any(r.method == m for r in rows)]
        of = {m: per_prompt([r for r in rows if r.method == m], units) for m in ran}
        cells.append({"setting": setting, "batch": batch, "best_fixed": fixed,
                      "tok_s": {m: float(of[m]["tokens"].sum() / of[m]["wall_s"].sum()) for m in of},
                      "tokens_per_call": {m: float(of[m]["tokens"].sum() / of[m]["nfe"].sum()) for m in of},
                      "vs_ar": paired(of["default"], of["ar"], counts)["throughput_ratio"],
                      "vs_best": paired(of["default"], of[fixed], counts)["throughput_ratio"],
                      "samplers": {m: {"vs_ar": paired(of[m], of["ar"], counts)["throughput_ratio"],
                                       "vs_best": paired(of[m], of[fixed], counts)["throughput_ratio"],
                                       "vs_default": paired(of[m], of["default"], counts)["throughput_ratio"]}
                                   for m in ran if m.startswith("default~")}})
    story = trace(candidates["default"], trace_prompt(load_tokenizer(path)), 2 * args.max_new_tokens, args.seed)
    return {"machine": {"processor": platform.processor() or platform.machine(), "cpu": cpu_name(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__},
            "options": {k: v for k, v in vars(args).items() if k != "out"} | {"model": str(path)},
            "dtype": str(model.dtype).removeprefix("torch."), "candidates": [name(c) for c in configs],
            "cells": cells, "records": [asdict(r) for r in records], "sweep": [asdict(r) for r in swept],
            "trace": story}


def trace_prompt(tokenizer) -> list[int]:
    """Repetitive code the model continues by copying, which sampling at T = 1 then leads elsewhere."""
    lines = "".join(f"    assert add({i}, {i + 1}) == {2 * i + 1}\n" for i in range(12))
    return tokenizer.encode(f"def add(a, b):\n    return a + b\n\n\ndef test_add():\n{lines}").ids


def report(result: dict) -> str:
    m = result["machine"]
    lines = [f"Default engine (adaptive) against AR and the best fixed configuration; {result['options']['model']}, "
             f"{result['dtype']}; {m['cpu']}, {m['threads']} threads, torch {m['torch']}; "
             f"{result['options']['limit']} scored HumanEval prompts "
             f"(sweep on {result['options']['sweep']} others), {result['options']['max_new_tokens']} new tokens"
             + (f"; units of {result['options']['queue']} batches' worth, at most a batch at once."
                if result['options'].get('queue', 1) > 1 else "."),
             "", "| setting | batch | default tok/s | AR tok/s | best fixed | its tok/s | tokens/call default | "
                 "default / AR [95%] | default / best [95%] |", "|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        f = c["best_fixed"]
        ar, best = c["vs_ar"], c["vs_best"]
        lines.append(f"| {c['setting']} | {c['batch']} | {c['tok_s']['default']:.0f} | {c['tok_s']['ar']:.0f} | {f} | "
                     f"{c['tok_s'][f]:.0f} | {c['tokens_per_call']['default']:.2f} | {ar['point']:.2f} "
                     f"[{ar['lo']:.2f}, {ar['hi']:.2f}] | {best['point']:.2f} [{best['lo']:.2f}, {best['hi']:.2f}] |")
    other = [(c, m, r) for c in result["cells"] for m, r in c.get("samplers", {}).items()]
    if other:
        lines += ["", "The default engine under another sampler (temperature > 0):", "",
                  "| setting | batch | engine | tok/s | tokens/call | / AR [95%] | / best fixed [95%] | / default [95%] |",
                  "|---|---|---|---|---|---|---|---|"]
        for c, m, r in other:
            lines.append(f"| {c['setting']} | {c['batch']} | {m} | {c['tok_s'][m]:.0f} | {c['tokens_per_call'][m]:.2f} | "
                         + " | ".join(f"{r[k]['point']:.2f} [{r[k]['lo']:.2f}, {r[k]['hi']:.2f}]"
                                      for k in ("vs_ar", "vs_best", "vs_default")) + " |")
    return "\n".join(lines) + "\n"


def plot(story: list[dict], path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    its = [s["iteration"] for s in story]
    ax.step(its, [s["rows"] for s in story], where="post", label="rows of the call (shape)")
    ax.plot(its, [s["tokens"] for s in story], ".", label="tokens emitted")
    ax.set_xlabel("iteration")
    ax.set_title("default engine, one request at T = 1: repetitive code, then its own text")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-adaptive", __doc__)
    add_model_args(p, "adaptive.json, adaptive.md, adaptive-trace.png", FULL, QUICK)
    p.add_argument("--candidates", type=int, nargs="+", default=list(range(len(CANDIDATES))),
                   choices=range(len(CANDIDATES)), metavar="I",
                   help="the fixed configurations swept for the best one, by index: "
                        + ", ".join(f"{i} {name(c)}" for i, c in enumerate(CANDIDATES)) + " (default all)")
    p.add_argument("--sweep", type=int, default=None, help=f"prompts of the sweep (default {FULL['sweep']})")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None, help=f"default {FULL['batch_sizes']}")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS,
                   help="sampling settings to run (default all)")
    p.add_argument("--queue", type=int, default=1,
                   help="batches' worth of prompts per unit, run at most a batch at once, the others waiting for a "
                        "slot (an open batch, as a loaded server's; default 1: a unit is one batch)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (default 0)")
    p.add_argument("--samplers", nargs="+", default=[], choices=SAMPLERS,
                   help="samplers to score the default engine under besides its own choice, at temperature > 0, "
                        "named default~<sampler> (default none)")
    args = p.parse_args(argv)
    if args.queue < 1:
        p.error(f"--queue must be at least 1, got {args.queue}")
    apply_preset(args, FULL, QUICK)
    torch.set_num_threads(args.threads)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adaptive.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "adaptive.md").write_text(report(result))
    plot(result["trace"], args.out / "adaptive-trace.png")
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
