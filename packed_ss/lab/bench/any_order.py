"""Any-order benchmark (paper F.5): SetDLM-style schedules and the threshold decoder side by side.

    python -m packed_ss bench-any-order --out DIR [options]      (or: python bench/any_order.py ...)
    python -m packed_ss bench-any-order --quick --out DIR        (about a minute)

On the shipped any-order model (or --model), greedy, HumanEval prompts: `ar`, the native threshold
decoder, and Packed-, Linear- and Quadratic-SS under LTR and confidence verification orders. Per
method: tokens/NFE, throughput, time/NFE, the non-model share of decoder time (the host-driven
any-order loop's own cost), accepted drafts per verification, and agreement: the
share of responses identical to the serial reference of Proposition C.1 replaying the run's own
orders (must be 1 for every speculative schedule), and to AR greedy (LTR orders must give 1; the
confidence order and the threshold decoder change the greedy trajectory). Paired bootstrap 95%
intervals (same prompts for every method) against Linear-SS under the same order.

Writes DIR/bench.json (every per-response record) and DIR/bench.md (the table, also printed).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...decode.any_order import serial_reference
from ...engine import Engine
from ...model.loading import default_model_path, load_model
from ...model.tokenizer import load_tokenizer
from ..humaneval import tokenized_prompts
from ..progress import progress
from .options import add_shared_args, apply_preset, width
from .report import any_order_markdown, write_results
from .stats import bootstrap_counts, paired, per_prompt

FULL = dict(limit=40, max_new_tokens=128)
QUICK = dict(limit=4, max_new_tokens=32)
# (schedule, verification order) of every method compared; ar and threshold have no order
ANY_ORDER_METHODS = [("ar", None), ("threshold", None)] + [(s, o) for o in ("ltr", "confidence")
                                                        for s in ("linear", "quadratic", "packed")]


@dataclass
class AnyOrderRecord:
    """One response of one method."""
    method: str
    order: str | None
    prompt: int
    tokens: int
    nfe: int
    wall_s: float
    model_s: float
    n_verify: int
    n_accepted: int
    same_as_serial: bool | None
    same_as_ar: bool | None = None
    ar_token_agreement: float | None = None


def method_label(method: str, order: str | None) -> str:
    return method if order is None else f"{method}-{order}"


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    path = Path(args.model) if args.model else default_model_path("any-order")
    adapter = {"auto": "auto", "none": None}.get(args.draft_adapter, args.draft_adapter)
    model = load_model(path, dtype=torch.float32, draft_adapter=adapter)
    if not model.cfg.any_order:
        raise SystemExit(f"--model: {path} is not an any-order model (config.json lacks any_order: true)")
    prompts = tokenized_prompts(load_tokenizer(path), args.limit)
    stops = [(t,) for t in model.cfg.eos_token_ids]
    engines = {(m, o): Engine(model, m, width=args.width, order=o) for m, o in ANY_ORDER_METHODS}
    for engine in engines.values():
        engine.generate(prompts[0][1], 8)                         # warm-up
    records, start = [], time.perf_counter()
    keys = list(engines)
    with progress(len(prompts) * len(engines), "responses", unit="response") as bar:
        for p, (task_id, ids) in enumerate(prompts):
            outs = {}
            for k in range(len(keys)):                            # rotate the order so drift hits all alike
                key = keys[(k + p) % len(keys)]
                out = outs[key] = engines[key].generate(ids, args.max_new_tokens)
                bar.set_postfix_str(f"{task_id} {method_label(*key)}: {len(out.tokens) / out.wall_s:.0f} tok/s",
                                    refresh=False)
                bar.update()
            ar = outs[("ar", None)].tokens
            for (m, o), out in outs.items():
                serial = None
                if args.serial and m not in ("ar", "threshold"):
                    serial = out.tokens == serial_reference(model, ids, out.iterations, args.max_new_tokens, stops)
                n = min(len(ar), len(out.tokens))
                agree = sum(a == b for a, b in zip(ar, out.tokens)) / max(len(ar), len(out.tokens))
                records.append(AnyOrderRecord(m, o, p, len(out.tokens), out.nfe, out.wall_s, out.model_s,
                                              out.n_verify, out.n_accepted, serial, out.tokens == ar,
                                              round(agree if n else 1.0, 4)))
    result = {"meta": {"model": str(path), "threads": torch.get_num_threads(), "n_prompts": len(prompts),
                       "width": args.width, "max_new_tokens": args.max_new_tokens, "torch": torch.__version__,
                       "draft_adapter": args.draft_adapter,
                       "widths": {method_label(*key): e.width for key, e in engines.items()},
                       "python": platform.python_version(), "command": " ".join(sys.argv),
                       "elapsed_s": time.perf_counter() - start, "serial_checked": args.serial}}
    result["summary"] = summary_rows(records, len(prompts), args)
    result["records"] = [asdict(r) for r in records]
    return result


def summary_rows(records: list[AnyOrderRecord], n_prompts: int, args) -> list[dict]:
    """One row per method: totals, rates, agreement shares, and the paired ratios to Linear-SS under the same
    order (LTR for ar and threshold) and to AR."""
    counts = bootstrap_counts(n_prompts, args.resamples, args.seed)
    ar = per_prompt([r for r in records if r.method == "ar"], n_prompts)
    rows = []
    for m, o in ANY_ORDER_METHODS:
        group = [r for r in records if (r.method, r.order) == (m, o)]
        tok, wall, nfe = sum(r.tokens for r in group), sum(r.wall_s for r in group), sum(r.nfe for r in group)
        verify = sum(r.n_verify for r in group)
        serial = [r.same_as_serial for r in group if r.same_as_serial is not None]
        row = {"method": m, "order": o, "tokens": tok, "nfe": nfe, "wall_s": wall, "throughput": tok / wall,
               "tokens_per_nfe": tok / nfe, "ms_per_nfe": 1e3 * wall / nfe,
               "nonmodel_frac": 1 - sum(r.model_s for r in group) / wall,
               "accepted_per_verify": sum(r.n_accepted for r in group) / verify if verify else None,
               "same_as_serial": sum(serial) / len(serial) if serial else None,
               "same_as_ar": sum(r.same_as_ar for r in group) / len(group),
               "ar_token_agreement": sum(r.ar_token_agreement for r in group) / len(group)}
        linear = [r for r in records if (r.method, r.order) == ("linear", o or "ltr")]
        if (m, o) != ("linear", o or "ltr"):
            row["vs_linear"] = paired(per_prompt(group, n_prompts), per_prompt(linear, n_prompts), counts)
        if m != "ar":
            row["vs_ar"] = paired(per_prompt(group, n_prompts), ar, counts)
        rows.append(row)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m packed_ss bench-any-order",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    add_shared_args(p, FULL, QUICK, outputs="bench.json, bench.md",
                    model="any-order model directory (default: the shipped one)")
    p.add_argument("--width", type=width, default=8,
                   help="active window W, 1..64, or 'auto' (each engine's own choice; default 8)")
    p.add_argument("--draft-adapter", default="auto",
                   help="the drafting adapter: 'auto' (the one the model ships, the default), 'none', or a directory")
    p.add_argument("--no-serial", dest="serial", action="store_false",
                   help="skip the serial-reference replay (it costs one full forward per token)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    apply_preset(args, FULL, QUICK)
    if args.limit < 1 or args.max_new_tokens < 1:
        raise SystemExit("--limit and --max-new-tokens must be >= 1")
    result = run(args)
    write_results(args.out, "bench", result, any_order_markdown(result))
    return 0
