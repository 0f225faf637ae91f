"""Sampler benchmark: the rejection rule (paper Alg. 2) against shared noise (Gumbel-max), side by side.

    python -m packed_ss bench-samplers --out DIR [options]      (or: python bench/samplers.py ...)
    python -m packed_ss bench-samplers --quick --out DIR        (about a minute)

On HumanEval prompts with the shipped model, Packed-SS, with and without the drafting adapter, at each width
and sampling setting (T = 1; T = 0.7 with top-p 0.95): every (prompt, seed) is decoded under both rules, in
alternating order, so the two are paired response by response. Reported per case: tokens per model call of
each rule, and the ratios gumbel / rejection of tokens per call and of throughput with paired bootstrap 95%
intervals over the prompts (stats.py). Writes DIR/samplers.json (every response) and DIR/samplers.md.
"""
from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ...engine import Engine
from ...model.loading import default_model_path, load_model
from ...model.tokenizer import load_tokenizer
from ..humaneval import tokenized_prompts
from ..progress import progress
from .options import add_shared_args, apply_preset, bench_parser, width
from .stats import bootstrap_counts, paired, per_prompt

SAMPLERS = ("rejection", "gumbel")
SETTINGS = {"T=1": dict(temperature=1.0), "T=0.7,top-p=0.95": dict(temperature=0.7, top_p=0.95)}
FULL = dict(limit=16, max_new_tokens=96, widths=["auto", 3, 8], samples=2)
QUICK = dict(limit=3, max_new_tokens=32, widths=[3], samples=1)


@dataclass
class SamplerRecord:
    adapter: bool
    width: int
    setting: str
    sampler: str
    prompt: int
    seed: int
    tokens: int
    nfe: int
    wall_s: float


def run(args) -> list[SamplerRecord]:
    path = args.model or default_model_path("default")
    prompts = [ids for _, ids in tokenized_prompts(load_tokenizer(path), args.limit)]
    records = []
    cases = [(a, w) for a in (True, False) for w in args.widths]
    bar = progress(total=len(cases) * len(SETTINGS) * len(prompts) * args.samples * 2, desc="responses")
    for adapter, w in cases:
        model = load_model(path, dtype=torch.float32, draft_adapter=(path / "drafter") if adapter else None)
        engines = {s: Engine(model, schedule="packed", width=w, sampler=s) for s in SAMPLERS}
        for setting, kwargs in SETTINGS.items():
            for p, prompt in enumerate(prompts):
                for k in range(args.samples):
                    seed = 1000 * p + k
                    order = SAMPLERS if (p + k) % 2 == 0 else SAMPLERS[::-1]   # alternate who goes first
                    for s in order:
                        r = engines[s].generate(prompt, max_new_tokens=args.max_new_tokens, seed=seed, **kwargs)
                        records.append(SamplerRecord(adapter, engines[s].width, setting, s, p, seed,
                                                     len(r.tokens), r.nfe, r.wall_s))
                        bar.update()
    bar.close()
    return records


def summarize(records: list[SamplerRecord], n_prompts: int, resamples: int) -> list[dict]:
    counts = bootstrap_counts(n_prompts, resamples, seed=0)
    rows = []
    keys = sorted({(r.adapter, r.width, r.setting) for r in records}, key=lambda k: (not k[0], k[1], k[2]))
    for adapter, w, setting in keys:
        by = {s: [r for r in records if (r.adapter, r.width, r.setting, r.sampler) == (adapter, w, setting, s)]
              for s in SAMPLERS}
        totals = {s: per_prompt(by[s], n_prompts) for s in SAMPLERS}
        ratio = paired(totals["gumbel"], totals["rejection"], counts)
        rows.append({"adapter": adapter, "width": w, "setting": setting,
                     **{f"tokens_per_nfe_{s}": totals[s]["tokens"].sum() / totals[s]["nfe"].sum() for s in SAMPLERS},
                     "tokens_per_nfe_ratio": ratio["tokens_per_nfe_ratio"],
                     "throughput_ratio": ratio["throughput_ratio"]})
    return rows


def markdown(rows: list[dict]) -> str:
    def ci(x):
        return f"{x['point']:.3f} [{x['lo']:.3f}, {x['hi']:.3f}]"
    lines = ["| adapter | W | setting | tokens/call rejection | tokens/call gumbel | gumbel/rejection tokens/call "
             "| gumbel/rejection throughput |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {'yes' if r['adapter'] else 'no'} | {r['width']} | {r['setting']} | "
                     f"{r['tokens_per_nfe_rejection']:.3f} | {r['tokens_per_nfe_gumbel']:.3f} | "
                     f"{ci(r['tokens_per_nfe_ratio'])} | {ci(r['throughput_ratio'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = bench_parser("python -m packed_ss bench-samplers", __doc__)
    add_shared_args(p, FULL, QUICK, "samplers.json, samplers.md", "model directory (default: the shipped model)")
    p.add_argument("--widths", type=width, nargs="+", default=None, help=f"default {FULL['widths']}")
    p.add_argument("--samples", type=int, default=None, help=f"seeds per prompt (default {FULL['samples']})")
    args = p.parse_args(argv)
    apply_preset(args, FULL, QUICK)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    records = run(args)
    rows = summarize(records, args.limit, args.resamples)
    table = markdown(rows)
    meta = {"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
            "threads": args.threads, "torch": torch.__version__, "seconds": time.time() - started}
    (args.out / "samplers.json").write_text(json.dumps({"meta": meta, "summary": rows,
                                                        "records": [asdict(r) for r in records]}, indent=1))
    (args.out / "samplers.md").write_text(table + "\n")
    print(table)
    return 0
