"""`python -m packed_ss profile-drafter MODEL_DIR [--draft-adapter DIR]`: a drafter's acceptance profile.

width="auto" needs the profile (draft_profile.json) beside the drafter it chooses for: train-drafter writes
one with every adapter it trains; this command measures it for any other drafter - a model's own drafting
mode, a released checkpoint's shipped adapter (Nemotron-Labs-Diffusion's `linear_spec_lora/`), or an
adapter after an engine change. Same options, same held-out continuations as train-drafter (options.py,
data.prompt_sets), same replay (profile.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ...model.loading import load_model
from ...model.sources import resolve_model
from ...model.tokenizer import load_tokenizer
from ...width import PROFILE_FILE
from . import data, options
from .profile import acceptance


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m packed_ss profile-drafter",
        description="Measure a drafter's acceptance profile - expected tokens per iteration at each width "
                    "1..W, replayed on the model's own greedy continuations of held-out corpus snippets - and "
                    "write it as draft_profile.json, where load_model reads it for width='auto': beside the "
                    "adapter, or in the model directory for the model's own drafter.")
    ap.add_argument("model", help="model directory, or a shipped model's name: 'default' or 'any-order'")
    ap.add_argument("--draft-adapter", default="auto",
                    help="'auto' (default: the adapter the model directory ships, else none), 'none', or a PEFT "
                         "adapter directory")
    ap.add_argument("--out", default=None,
                    help=f"directory to write {PROFILE_FILE} to (default: the adapter's, else the model's)")
    ap.add_argument("--sequences", type=int, default=data.TRAIN_SEQUENCES,
                    help="train-drafter's --sequences: its training prompts are drawn before the held-out ones, so "
                         f"with its value (default {data.TRAIN_SEQUENCES}, its default) and its other options the "
                         "held-out continuations are the ones that run evaluated on")
    options.add_arguments(ap)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = resolve_model(args.model)
        model = load_model(path, device=args.device,
                           draft_adapter=None if args.draft_adapter == "none" else args.draft_adapter)
        options.check_arguments(args, model)
        if args.sequences < 0:
            raise ValueError(f"--sequences must be an integer >= 0, got {args.sequences}")
        torch.set_num_threads(args.threads)
        _, held_prompts = data.prompt_sets(args, load_tokenizer(path), torch.Generator().manual_seed(args.seed),
                                           args.sequences)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    held = data.continuations(model, held_prompts, args.gen_tokens, 0.0, args.seed, "continuations (held out)")
    measured = acceptance(model, held, args.width, model.cfg.any_order, "acceptance")
    adapter = model.adapter_dir
    out = Path(args.out) if args.out else (adapter or path)
    out.mkdir(parents=True, exist_ok=True)
    (out / PROFILE_FILE).write_text(json.dumps({"width": args.width, **measured["profile"]}, indent=2) + "\n")
    print(f"drafter: {adapter or 'the model itself'}; {len(held)} held-out continuations, "
          f"{measured['drafts']} drafts; mean leading match at W={args.width}: {measured['mean_leading']}\n")
    print("| W | packed (lagged) | linear / quadratic (fresh) |\n|---|---|---|")
    for w in range(args.width):
        print(f"| {w + 1} | {measured['profile']['lagged'][w]} | {measured['profile']['fresh'][w]} |")
    print(f"\nwrote {out / PROFILE_FILE}")
    return 0
