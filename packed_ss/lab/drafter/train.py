"""`python -m packed_ss train-drafter MODEL_DIR --out ADAPTER_DIR`: a drafting LoRA by self-distillation.

1. The base model continues prompts from the corpus (data.py): training continuations from the training
   split, greedy and sampled; evaluation continuations (greedy) from the held-out split.
2. A fresh LoRA on the drafting rows (lora.py; base frozen) learns to draft the model's own continuation: each
   step takes --batch continuations, runs the base model over each once for the prefix K/V, then one drafting
   call with --queries prefixes of a random width 1..W (calls.py: the engine's own layouts), and minimises
   the cross-entropy of the drafts against the continuation's tokens (AdamW, warm-up, cosine).
3. Per-slot acceptance before and after (profile.py), and held-out tokens per call every --eval-every steps
   (the curve); the adapter (PEFT layout), its acceptance profile (draft_profile.json, read by width="auto"),
   a report (report.json, REPORT.md) and the curve's plot go to --out.
A run keeps its continuations and a checkpoint in --out (resume.py); --resume goes on from them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ...model.adapter import TARGETS
from ...model.loading import load_model
from ...model.sources import resolve_model
from ...model.tokenizer import load_tokenizer
from ...width import PROFILE_FILE
from ..bench.report import pyplot
from ..train.loop import fit, mean_last
from . import data, lora, options, resume
from .calls import base_cache, drafting_logits, targets
from .profile import acceptance

IGNORE = -100
CURVE_PLOT = "curve.png"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m packed_ss train-drafter",
        description="Train a drafting LoRA for MODEL_DIR by self-distillation: the model continues corpus "
                    "snippets (greedy and sampled), then a LoRA on the drafting rows only (base weights frozen, "
                    "prefix K/V from the base model, the engine's own call layouts) learns to draft those "
                    "continuations. Writes a PEFT adapter (adapter_config.json, adapter_model.safetensors), "
                    "its acceptance profile (draft_profile.json, used by width='auto') and a report with the "
                    "per-slot acceptance before and after. Load it with load_model(MODEL_DIR, "
                    "draft_adapter=ADAPTER_DIR); it changes drafts (speed), never the output.")
    ap.add_argument("model", help="model directory, or a shipped model's name: 'default' or 'any-order'")
    ap.add_argument("--out", required=True, help="adapter directory to write (created)")
    ap.add_argument("--steps", type=int, default=300, help="optimisation steps (default 300)")
    ap.add_argument("--rank", type=int, default=32, help="LoRA rank r (default 32)")
    ap.add_argument("--alpha", type=float, default=None, help="LoRA alpha; scale = alpha / r (default: r)")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated linear layers to adapt (default all: {','.join(TARGETS)})")
    ap.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    ap.add_argument("--warmup", type=int, default=20, help="linear warm-up steps (default 20)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor as a share of --lr (0.1)")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip (default 1)")
    ap.add_argument("--batch", type=int, default=4, help="continuations per step (default 4)")
    ap.add_argument("--queries", type=int, default=48, help="drafting prefixes per continuation and step (48)")
    ap.add_argument("--sequences", type=int, default=data.TRAIN_SEQUENCES,
                    help=f"training continuations to generate ({data.TRAIN_SEQUENCES})")
    ap.add_argument("--sampled-frac", type=float, default=0.5,
                    help="share of training continuations sampled at T=1 instead of greedy (default 0.5)")
    ap.add_argument("--eval-every", type=int, default=50,
                    help="measure held-out tokens per call every N steps, for the report's curve (default 50; "
                         "0: before and after only)")
    ap.add_argument("--checkpoint-every", type=int, default=25,
                    help="write OUT/checkpoint.pt every N steps and at the end (default 25; 0: never)")
    ap.add_argument("--resume", action="store_true",
                    help="go on from OUT's continuations and last checkpoint (same options; --steps may grow)")
    options.add_arguments(ap)
    ap.add_argument("--log-every-s", type=float, default=None, help="progress bar refresh interval in seconds")
    return ap


def check_args(args, model) -> list[str]:
    for name, low in (("steps", 1), ("rank", 1), ("batch", 1), ("queries", 1), ("sequences", 1), ("warmup", 0),
                      ("eval_every", 0), ("checkpoint_every", 0)):
        if getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {getattr(args, name)}")
    options.check_arguments(args, model)
    if not 0 <= args.sampled_frac <= 1:
        raise ValueError(f"--sampled-frac must be in [0, 1], got {args.sampled_frac}")
    targets_ = [t for t in args.targets.split(",") if t]
    if not targets_ or any(t not in TARGETS for t in targets_):
        raise ValueError(f"--targets must be a comma-separated subset of {','.join(TARGETS)}, got {args.targets!r}")
    return targets_


def step_loss(model, train, args, gen: torch.Generator):
    """The drafting cross-entropy of one step: --batch continuations, --queries prefixes each, width 1..W."""
    any_order = model.cfg.any_order

    def loss():
        total, count = 0.0, 0
        for i in torch.randint(len(train), (args.batch,), generator=gen).tolist():
            first, seq = train[i]
            width = int(torch.randint(1, args.width + 1, (), generator=gen))
            pool = torch.arange(first, seq.numel(), device=seq.device)
            starts = pool[torch.randperm(len(pool), generator=gen)[:args.queries].to(seq.device)]
            logits = drafting_logits(model, seq, base_cache(model, seq), starts, width, any_order)
            tgt = targets(seq, starts, width, IGNORE)
            total = total + F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), ignore_index=IGNORE,
                                            reduction="sum")
            count += int((tgt != IGNORE).sum())
        value = total / max(count, 1)
        return value, {"draft_ce": value.detach()}, {}
    return loss


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    out = Path(args.out)
    try:
        path = resolve_model(args.model)
        model = load_model(path, device=args.device, draft_adapter=None)
        targets_ = check_args(args, model)
        torch.set_num_threads(args.threads)
        gen = torch.Generator().manual_seed(args.seed)
        train_prompts, held_prompts = data.prompt_sets(args, load_tokenizer(path), gen, args.sequences)
        data_key = resume.options(args, resume.DATA_OPTIONS, model=str(path))
        kept = resume.load_data(out, data_key, model.device) if args.resume else None
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if kept is None:
        train = data.continuations(model, train_prompts, args.gen_tokens, args.sampled_frac, args.seed,
                                   "continuations (train)")
        held = data.continuations(model, held_prompts, args.gen_tokens, 0.0, args.seed, "continuations (eval)")
        resume.save_data(out, data_key, train, held)
    else:
        train, held = kept
    generated_s = time.time() - started
    alpha = args.alpha if args.alpha is not None else float(args.rank)
    params = lora.attach(model, targets_, args.rank, alpha, gen)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    state_key = resume.options(args, resume.TRAINING_OPTIONS, model=str(path))
    try:
        restored = resume.load_state(out, state_key, params, opt, gen) if args.resume else None
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    history, record = restored or ([], {})

    def measure(desc: str) -> dict:
        return acceptance(model, held, args.width, model.cfg.any_order, desc)

    if "before" not in record:          # the fresh adapter adds nothing yet (B = 0): the base's own drafts
        record = {"before": measure("acceptance before"), "curve": []}
        record["curve"].append(curve_point(0, record["before"]))

    def after_step(step: int, history: list[dict]) -> None:
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            record["curve"].append(curve_point(step, measure(f"acceptance at step {step}")))
        if args.checkpoint_every and (step % args.checkpoint_every == 0 or step == args.steps):
            resume.save_state(out, state_key, params, opt, gen, history, record)

    t0 = time.time()
    history = fit(torch.nn.ParameterList(params), [(opt, [args.lr])], args, step_loss(model, train, args, gen),
                  history, after_step)
    train_s = time.time() - t0
    after = measure("acceptance after")
    curve = [*(p for p in record["curve"] if p["step"] < args.steps), curve_point(args.steps, after)]
    lora.save(model, out, targets_, args.rank, alpha)
    (out / PROFILE_FILE).write_text(json.dumps({"width": args.width, **after["profile"]}, indent=2) + "\n")
    report = {
        "command": "python -m packed_ss train-drafter " + " ".join(args.argv), "model": str(path),
        "adapter": {"rank": args.rank, "alpha": alpha, "targets": targets_,
                    "parameters": sum(p.numel() for p in params)},
        "data": {"corpus": args.data or "standard library (training split)", "sequences": len(train),
                 "sampled": len(train) - round(len(train) * (1 - args.sampled_frac)),
                 "tokens": sum(s.numel() - f for f, s in train), "eval_sequences": len(held),
                 "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens},
        "training": {"steps": args.steps, "batch": args.batch, "queries": args.queries, "width": args.width,
                     "lr": args.lr, "seed": args.seed, "threads": args.threads, "device": args.device,
                     "loss_first": mean_last(history[:20], "draft_ce", 20), "loss_last": mean_last(history, "draft_ce"),
                     "loss_every_10": [round(h["draft_ce"], 4) for h in history[::10]]},
        "seconds": {"data": round(generated_s, 1), "training": round(train_s, 1),
                    "total": round(time.time() - started, 1)},      # this process's (a resumed run's: since resuming)
        "before": record["before"], "after": after, "curve": curve,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "REPORT.md").write_text(report_md(report))
    plot_curve(curve, args.width, out / CURVE_PLOT)
    print(report_md(report))
    return 0


def curve_point(step: int, measured: dict) -> dict:
    """Held-out tokens per call at the trained width W, by replay kind, and the mean leading match, at `step`."""
    width = measured["width"]
    return {"step": step, "mean_leading": measured["mean_leading"],
            "tokens_per_call": {kind: tokens[width - 1] for kind, tokens in measured["profile"].items()}}


def plot_curve(curve: list[dict], width: int, file: Path) -> None:
    """The curve of held-out tokens per call against steps, when matplotlib (the `bench` extra) is importable."""
    try:
        plt = pyplot()
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [p["step"] for p in curve]
    for kind in curve[0]["tokens_per_call"]:
        ax.plot(steps, [p["tokens_per_call"][kind] for p in curve], marker="o", label=kind)
    ax.set(xlabel="step", ylabel=f"tokens per call at W={width}", title="held-out greedy replay")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)


def report_md(r: dict) -> str:
    b, a, t = r["before"], r["after"], r["training"]
    rows = [f"| {name} | {b[key] if key == 'mean_leading' else b[key][:8]} | "
            f"{a[key] if key == 'mean_leading' else a[key][:8]} |"
            for name, key in (("slot accuracy (first 8)", "slot_accuracy"), ("P(h >= k) (first 8)", "leading_at_least"),
                              (f"mean leading match h at W={b['width']}", "mean_leading"))]
    prof = [f"| {w + 1} | {b['profile']['lagged'][w]} | {a['profile']['lagged'][w]} | {b['profile']['fresh'][w]} | "
            f"{a['profile']['fresh'][w]} |" for w in range(b["width"])]
    kinds = list(r["curve"][0]["tokens_per_call"])
    curve = [f"| {p['step']} | {p['mean_leading']} | {' | '.join(str(p['tokens_per_call'][k]) for k in kinds)} |"
             for p in r["curve"]]
    d = r["data"]
    return "\n".join([
        "# Drafting adapter: training report", "", "```", r["command"], "```", "",
        f"LoRA r={r['adapter']['rank']}, alpha={r['adapter']['alpha']} on {', '.join(r['adapter']['targets'])} "
        f"({r['adapter']['parameters']:,} parameters); base frozen.",
        f"Data: {d['sequences']} continuations ({d['sampled']} sampled at T=1) of {d['prompt_tokens']}-token prompts "
        f"from {d['corpus']}, {d['tokens']:,} generated tokens; evaluation on {d['eval_sequences']} held-out greedy "
        "continuations.",
        f"Training: {t['steps']} steps x {t['batch']} continuations x {t['queries']} prefixes, widths 1..{t['width']}, "
        f"AdamW lr {t['lr']}, seed {t['seed']}, {t['threads']} threads on {t['device']}; drafting CE "
        f"{t['loss_first']} (first 20 steps) -> {t['loss_last']} (last 50).",
        f"Time in this process: data {r['seconds']['data']} s, training {r['seconds']['training']} s, total "
        f"{r['seconds']['total']} s.",
        "", "| held-out, greedy | before | after |", "|---|---|---|", *rows, "",
        "Acceptance profile: tokens per iteration, replayed greedy decoding", "",
        "| W | packed (lagged) before | after | linear / quadratic (fresh) before | after |",
        "|---|---|---|---|---|", *prof, "",
        f"Curve: held-out tokens per call at W={b['width']} against steps ({CURVE_PLOT})", "",
        f"| step | mean leading match | {' | '.join(kinds)} |", "|---:|---:|" + "---:|" * len(kinds), *curve, ""])
