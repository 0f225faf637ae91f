"""Schedule benchmark: which schedule, which width, how much faster (paper section 4, appendix E.5).

    python -m packed_ss bench --out DIR [options]        (or: python bench/schedules.py ...)
    python -m packed_ss bench --quick --out DIR          (about a minute: 4 prompts, 32 tokens, W=4)

One run does three things on one model directory:
1. Per-call latency: model forward time against input rows n at a fixed cached length, over the
   schedules' own call layouts, fitted to tau + delta * n by least squares (latency.py).
2. Schedule comparison on HumanEval prompts: every schedule x width x temperature; per response the
   generated tokens, NFE, decoder wall time, model time and prefill time; the paper's aggregates and
   paired bootstrap 95% intervals (same prompt indices for every method) against Linear-SS at the same
   width and temperature.
3. Peers on the same weights: transformers' `generate` (greedy or sampling) and its prompt-lookup
   decoding (drafting W tokens), next to our `ar` schedule (methods.py); `--drafts` adds our schedules with
   lookup drafts ("lookup": alone, "both": joined with the diffusion proposals; methods "packed+both" ...),
   compared with transformers' prompt lookup at the same width as well.
From the fit and the measured tokens per iteration, a cost model predicts each schedule's model time per
iteration and its throughput ratio to Linear-SS, next to what was measured, so that misses can be traced
to the call cost, to the acceptance, or to non-model decoder time.

Writes DIR/bench.json (every per-response record), DIR/bench.md (the tables, also printed),
DIR/latency.png and DIR/ratios.png (report.py).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ...decode.registry import schedules
from ...decode.schedules import DRAFT_SOURCES
from ...engine import SAMPLERS
from ...model.loading import DTYPE_NAMES
from ...model.tokenizer import load_tokenizer
from ..humaneval import tokenized_prompts
from ..progress import progress
from .latency import engine_capacity, measure_latency
from .methods import HF, CallTimer, Ours, load_hf
from .options import add_shared_args, apply_preset, cpu_name, load_bench_model, width
from .report import plot_latency, plot_ratios, schedules_markdown, write_results
from .stats import bootstrap_counts, paired, per_prompt

FIXED = [s for s in schedules() if s != "adaptive"]     # one call shape each; adaptive (the default) on request

PEERS = ("hf", "hf-lookup")
PEER_LOOKUP = 10    # transformers' prompt lookup width where every width is "auto" (its candidate generator's default)
FULL = dict(limit=40, max_new_tokens=128, widths=[8], latency_reps=30)
QUICK = dict(limit=4, max_new_tokens=32, widths=[4], latency_reps=5)


@dataclass
class ScheduleRecord:
    """One response. `iterations`: decode iterations after the prefill call (verifications, AR steps)."""
    method: str
    width: int | str | None     # "auto": the engine chose (summary rows give the choice)
    temperature: float
    prompt: int
    sample: int
    seed: int
    tokens: int
    nfe: int
    wall_s: float
    model_s: float
    prefill_s: float
    iterations: int
    n_accepted: int
    same_as_ar: bool | None = None
    differs_at: int | None = None      # greedy: the first token that differs from our ar's (None: the same)


def run(args) -> dict:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    torch.set_num_threads(args.threads)
    adapter = {"auto": "auto", "none": None}.get(args.draft_adapter, args.draft_adapter)
    path, model = load_bench_model(args, device=args.device, draft_adapter=adapter)
    dtype = model.dtype
    prompts = tokenized_prompts(load_tokenizer(path), args.limit)
    lengths = [len(ids) for _, ids in prompts]
    start, load0 = time.perf_counter(), os.getloadavg()[0]

    timer = CallTimer(model, model.device)
    methods = [Ours(model, name, w, timer, drafts, sampler) for sampler in [None] + args.samplers
               for name in args.schedules if name != "ar" for w in args.widths
               for drafts in ([None] if name in ("lookup", "adaptive") else
                              sorted(set(args.drafts) | ({"diffusion"} if name == "linear" else set())))]
    if "ar" in args.schedules:
        methods.insert(0, Ours(model, "ar", 1, timer))
    widths = sorted({m.engine.width for m in methods if m.name != "ar"})
    cache_len = int(np.mean(lengths)) + args.max_new_tokens // 2
    capacity = engine_capacity(int(np.median(lengths)), args.max_new_tokens, max(widths))
    log(f"latency: {args.latency_reps} repetitions per layout at {cache_len} cached tokens ...")
    latency = measure_latency(model, widths, cache_len, capacity, args.latency_reps)
    log(f"  tau = {latency['tau_ms']:.3f} ms, delta = {latency['delta_ms']:.4f} ms/row, "
        f"RMS residual {latency['rms_residual_ms']:.3f} ms")
    if args.peers:
        hf_model = load_hf(path, dtype, args.device)
        hf_timer = CallTimer(hf_model, model.device)
        eos = list(model.cfg.eos_token_ids)
        if "hf" in args.peers:
            methods.append(HF(hf_model, None, eos, hf_timer))
        if "hf-lookup" in args.peers:
            fixed = [w for w in args.widths if w != "auto"]
            methods += [HF(hf_model, w, eos, hf_timer) for w in fixed or [PEER_LOOKUP]]
    for m in methods:
        m.warm_up(prompts[0][1], args.max_new_tokens)

    records: list[ScheduleRecord] = []
    def running(t):
        return [m for m in methods if t > 0 or not m.sampled_only]
    jobs = sum(len(prompts) * (1 if t == 0 else args.samples) * len(running(t)) for t in args.temperatures)
    with progress(jobs, "responses", unit="response") as bar:
        for t in args.temperatures:
            for p, (task_id, ids) in enumerate(prompts):
                for s in range(1 if t == 0 else args.samples):
                    seed = args.seed + 1000 * p + s
                    group = []
                    these = running(t)
                    for k in range(len(these)):                    # rotate the order so drift hits all alike
                        m = these[(k + p + s) % len(these)]
                        tokens, stats = m.run(ids, args.max_new_tokens, t, seed, args.top_p)
                        group.append((ScheduleRecord(m.name, m.width, t, p, s, seed, **stats), tokens))
                        bar.set_postfix_str(f"T={t:g} {task_id} {m.name}{'' if m.width is None else f' W={m.width}'}: "
                                            f"{stats['tokens'] / stats['wall_s']:.0f} tok/s", refresh=False)
                        bar.update()
                    ar = next((tokens for rec, tokens in group if rec.method == "ar"), None)
                    for rec, tokens in group:
                        rec.same_as_ar = tokens == ar if t == 0 and ar is not None else None
                        rec.differs_at = first_difference(tokens, ar) if rec.same_as_ar is False else None
                        records.append(rec)

    result = {"meta": {"model": str(path), "dtype": str(dtype).removeprefix("torch."),
                       "dtype_source": model.dtype_source, "device": str(model.device),
                       "threads": torch.get_num_threads(), "n_prompts": len(prompts), "limit": args.limit,
                       "max_new_tokens": args.max_new_tokens, "widths": args.widths,
                       "draft_adapter": args.draft_adapter, "draft_profile": model.draft_profile is not None,
                       "auto_widths": {m.name: m.engine.width for m in methods
                                       if isinstance(m, Ours) and m.width == "auto"},
                       "temperatures": args.temperatures, "top_p": args.top_p, "samples": args.samples, "seed": args.seed,
                       "resamples": args.resamples, "quick": args.quick, "schedules": args.schedules,
                       "peers": args.peers, "torch": torch.__version__, "python": platform.python_version(),
                       "cpu": cpu_name(), "command": " ".join(sys.argv),
                       "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
                       "elapsed_s": time.perf_counter() - start},
              "prompts": [{"task_id": tid, "prompt_tokens": n} for (tid, _), n in zip(prompts, lengths)],
              "latency": latency}
    result.update(analyse(records, methods, latency, args, len(prompts)))
    result["records"] = [asdict(r) for r in records]
    return result


def analyse(records: list[ScheduleRecord], methods: list, latency: dict, args, n_prompts: int) -> dict:
    """Per (method, width, temperature) aggregates, paired intervals against Linear-SS, against our AR and against
    transformers' prompt lookup (at the same width; for width "auto", at the widest one run), and the cost model
    against Linear-SS.

    Width-free methods (ar, hf) are compared with Linear-SS at every width.
    """
    counts = bootstrap_counts(n_prompts, args.resamples, args.seed)
    by_key = {(m.name, m.width): m for m in methods}
    summary, costs = [], []
    for t in args.temperatures:
        groups = {key: [r for r in records if r.temperature == t and (r.method, r.width) == key] for key in by_key}
        ar = per_prompt(groups[("ar", None)], n_prompts) if ("ar", None) in groups else None
        for w in args.widths:
            linear = per_prompt(groups[("linear", w)], n_prompts)
            peers = [m.width for m in methods if m.name == "hf-lookup"]      # the same width, else the widest
            peer_w = w if w in peers else max(peers, default=None)
            peer = per_prompt(groups[("hf-lookup", peer_w)], n_prompts) if peers else None
            linear_cost = cost_model(by_key[("linear", w)], groups[("linear", w)], latency)
            for key, m in by_key.items():
                if (m.width not in (w, None) and key != ("hf-lookup", peer_w)) or (t == 0 and m.sampled_only):
                    continue
                row = {"method": m.name, "width": m.width, "vs_width": w, "temperature": t,
                       "engine_width": m.engine.width if isinstance(m, Ours) and m.width else None,
                       **aggregate(groups[key])}
                if key != ("linear", w):
                    row["vs_linear"] = paired(per_prompt(groups[key], n_prompts), linear, counts)
                if ar is not None and key != ("ar", None):
                    row["vs_ar"] = paired(per_prompt(groups[key], n_prompts), ar, counts)
                if peer is not None and key != ("hf-lookup", peer_w):
                    row["vs_hf_lookup"] = paired(per_prompt(groups[key], n_prompts), peer, counts)
                summary.append(row)
                if isinstance(m, Ours) and m.layouts is not None:
                    c = cost_model(m, groups[key], latency)
                    c["ratio_vs_linear"] = {k: v / linear_cost["rate"][k] for k, v in c.pop("rate").items()}
                    costs.append({"method": m.name, "width": m.width, "engine_width": m.engine.width,
                                  "vs_width": w, "temperature": t, **c})
    return {"summary": summary, "cost_model": costs}


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where two different outputs part (a prefix's length if one ends first)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def aggregate(records: list[ScheduleRecord]) -> dict:
    """The paper's aggregates over one method's responses (rates from totals)."""
    tok = sum(r.tokens for r in records)
    wall = sum(r.wall_s for r in records)
    model = sum(r.model_s for r in records)
    nfe = sum(r.nfe for r in records)
    iters = sum(r.iterations for r in records)
    return {"responses": len(records), "tokens": tok, "nfe": nfe, "wall_s": wall, "model_s": model,
            "throughput": tok / wall, "tokens_per_nfe": tok / nfe, "ms_per_nfe": 1e3 * wall / nfe,
            "model_ms_per_nfe": 1e3 * model / nfe, "nonmodel_frac": 1 - model / wall,
            "iterations": iters, "mean_accepted": sum(r.n_accepted for r in records) / iters if iters else 0.0,
            "prefill_s": sum(r.prefill_s for r in records)}


def cost_model(method: Ours, records: list[ScheduleRecord], fit: dict) -> dict:
    """Per decode iteration (after the prefill): fit-predicted model time (calls x tau + rows x delta)
    against the measured model and non-model time, and the tokens it yields."""
    calls = len(method.layouts)
    rows = sum(lay.rows for lay in method.layouts)
    iters = sum(r.iterations for r in records) or 1
    model_ms = 1e3 * sum(r.model_s - r.prefill_s for r in records) / iters
    wall_ms = 1e3 * sum(r.wall_s - r.prefill_s for r in records) / iters
    tokens = sum(r.tokens - 1 for r in records) / iters    # the prefill emits one token
    pred_ms = calls * fit["tau_ms"] + rows * fit["delta_ms"]
    return {"calls_per_iter": calls, "rows_per_iter": rows, "tokens_per_iter": tokens,
            "pred_model_ms_per_iter": pred_ms, "model_ms_per_iter": model_ms, "nonmodel_ms_per_iter": wall_ms - model_ms,
            "rate": {"pred": tokens / pred_ms, "model": tokens / model_ms, "wall": tokens / wall_ms}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m packed_ss bench",
        description="Benchmark the decoding schedules on HumanEval prompts: per-call latency fit, throughput, "
                    "tokens/NFE, time/NFE, model vs non-model time, paired bootstrap 95% intervals against "
                    "Linear-SS, transformers peers on the same weights, and a cost model.")
    add_shared_args(p, FULL, QUICK, outputs="bench.json, bench.md, *.png",
                    model="a model directory, a GGUF file or a name (tiny, smollm2-135m; default: tiny)")
    p.add_argument("--widths", type=width, nargs="+", default=None,
                   help=f"speculative widths, integers or 'auto' (the engine's choice; default {FULL['widths']})")
    p.add_argument("--draft-adapter", default="auto",
                   help="the drafting adapter: 'auto' (the one the model ships, the default), 'none', or a directory")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="default: 0 1")
    p.add_argument("--samples", type=int, default=1, help="responses per prompt at temperature > 0 (default 1)")
    p.add_argument("--schedules", nargs="+", default=FIXED, choices=list(schedules()),
                   help="our schedules (default all with one call shape; linear is required: it is the baseline; "
                        "adaptive, the default engine, on request: it has no cost-model row)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus filter at temperature > 0, ours and transformers' (default none)")
    p.add_argument("--drafts", nargs="+", default=["diffusion"], choices=DRAFT_SOURCES,
                   help="draft sources of packed, linear and quadratic (default diffusion; Linear-SS with diffusion "
                        "drafts, the baseline, always runs)")
    p.add_argument("--samplers", nargs="+", default=[], choices=SAMPLERS,
                   help="samplers to run our schedules under besides the engine's own choice, at temperature > 0 "
                        "only, named schedule~sampler (default none)")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                   help="transformers peers on the same weights: greedy / sampling, and prompt lookup at each "
                        f"integer width (at {PEER_LOOKUP} tokens where every width is auto); default both, "
                        "none: --peers")
    p.add_argument("--latency-reps", type=int, default=None,
                   help=f"timed calls per layout in the latency sweep (default {FULL['latency_reps']})")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (default 0)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                   help="model dtype, for ours and transformers' (default float32; auto: the faster here)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help="run the batch study instead: generate_batch at these batch sizes against the same "
                        "requests one after another (packed_ss/lab/bench/batch.py; its options: "
                        "bench --batch-sizes 1 --help)")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--batch-sizes", nargs="+")
    if pre.parse_known_args(argv)[0].batch_sizes is not None:     # the batch study instead (batch.py)
        from .batch import main as batch_main
        return batch_main(argv)
    args = build_parser().parse_args(argv)
    apply_preset(args, FULL, QUICK)
    if "linear" not in args.schedules:
        print("error: --schedules must include linear (the baseline)", file=sys.stderr)
        return 2
    if args.top_p is not None and not 0 < args.top_p <= 1:
        print(f"error: --top-p must be in (0, 1], got {args.top_p}", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_results(args.out, "bench", result, schedules_markdown(result))
    plot_latency(result["latency"], args.out / "latency.png")
    plot_ratios(result, args.out / "ratios.png")
    print(f"wrote {args.out}/bench.json, bench.md, latency.png, ratios.png", file=sys.stderr)
    return 0
