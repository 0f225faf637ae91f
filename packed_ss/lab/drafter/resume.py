"""A train-drafter run that stops and goes on: what it keeps in its output directory.

- DATA_FILE: the continuations (training and held-out) with the options that made them. Generating them is
  the first long stage of a run on a real model; a resumed run reads them back instead.
- STATE_FILE: the run at its last checkpoint, written every --checkpoint-every steps and replaced whole
  (written aside, then renamed): the adapter, the optimizer, the batch generator, the losses and the curve
  so far. A resumed run continues from the step after it and ends where an uninterrupted run would have.
Options that change what is trained must match the checkpoint's; --steps may grow (the cosine schedule is
then stretched from the step the run resumes at).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

DATA_FILE = "continuations.pt"
STATE_FILE = "checkpoint.pt"
DATA_OPTIONS = ("seed", "data", "data_suffix", "heldout_pct", "prompt_tokens", "gen_tokens", "sequences",
                "sampled_frac", "eval_sequences", "eval_functions")
TRAINING_OPTIONS = ("seed", "rank", "alpha", "targets", "lr", "warmup", "min_lr_ratio", "grad_clip", "batch",
                    "queries", "width")

Sequences = list[tuple[int, torch.Tensor]]


def options(args, names: tuple[str, ...], **extra) -> dict:
    return {**extra, **{name: getattr(args, name) for name in names}}


def _save(obj, file: Path) -> None:
    aside = file.with_suffix(".part")
    torch.save(obj, aside)
    os.replace(aside, file)


def _check(file: Path, saved: dict, wanted: dict) -> None:
    differ = {k: (saved.get(k), v) for k, v in wanted.items() if saved.get(k) != v}
    if differ:
        said = ", ".join(f"{k} {old!r} there, {new!r} now" for k, (old, new) in differ.items())
        raise ValueError(f"--resume: {file} was made with other options ({said}); resume with the same "
                         "options, or start afresh in another --out")


def load_data(out: Path, key: dict, device) -> tuple[Sequences, Sequences] | None:
    """The (training, held-out) continuations a run in `out` generated with options `key`; None if none."""
    file = out / DATA_FILE
    if not file.is_file():
        return None
    saved = torch.load(file, map_location=device)
    _check(file, saved["options"], key)
    return saved["train"], saved["held"]


def save_data(out: Path, key: dict, train: Sequences, held: Sequences) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _save({"options": key, "train": train, "held": held}, out / DATA_FILE)


def save_state(out: Path, key: dict, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer,
               gen: torch.Generator, history: list[dict], record: dict) -> None:
    """The run after len(history) steps; `record` holds what the report needs (acceptance before, the curve)."""
    _save({"options": key, "params": [p.detach() for p in params], "optimizer": opt.state_dict(),
           "generator": gen.get_state(), "history": history, "record": record}, out / STATE_FILE)


def load_state(out: Path, key: dict, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer,
               gen: torch.Generator) -> tuple[list[dict], dict] | None:
    """Restore the last checkpoint into `params`, `opt` and `gen`; (history, record), or None if there is none."""
    file = out / STATE_FILE
    if not file.is_file():
        return None
    saved = torch.load(file, map_location=params[0].device)
    _check(file, saved["options"], key)
    with torch.no_grad():
        for p, value in zip(params, saved["params"], strict=True):
            p.copy_(value)
    opt.load_state_dict(saved["optimizer"])
    gen.set_state(saved["generator"])
    return saved["history"], saved["record"]
