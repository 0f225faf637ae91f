"""Self-distillation data: the model's own continuations of corpus snippets, decoded by the engine.

Corpus: the standard library's `.py` files (the split the shipped models were trained on: training files for
the adapter, held-out files for its evaluation) or the user's own text (--data: a directory of files ending
in --data-suffix, or one file cut into pieces of PIECE_LINES lines), split the same way, by a hash of the
name. HumanEval is never read here: it is the benchmark. A prompt is --prompt-tokens tokens from a random
line of a document; the base model continues it for --gen-tokens tokens, greedily or sampled at T = 1 (so
that both kinds of decoding gain), with the engine (output equals AR decoding, exactly or in distribution).
The held-out set adds --eval-functions prompts that end after a function's signature and docstring: the
model then writes the function's body, the text where drafts run furthest (indentation), which random-line
prompts rarely start at.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ...engine import Engine
from ..progress import progress
from ..train.data import collect_py_files, is_heldout, stdlib_dir

PIECE_LINES = 100
TRAIN_SEQUENCES = 400
GEN_BATCH = 8
FUNCTION = re.compile(r'^( *)def [^\n]*:\n\1    ("""|\'\'\').*?\2\n', re.M | re.S)   # one-line signature, docstring


def prompt_sets(args, tokenizer, gen: torch.Generator, sequences: int) -> tuple[list[list[int]], list[list[int]]]:
    """(`sequences` training prompts, --eval-sequences held-out prompts and --eval-functions held-out function
    prompts), drawn from `gen` in this order: the held-out set depends on the seed, the data options and
    `sequences` only, so profile-drafter can measure the held-out set a train-drafter run evaluated on."""
    train_texts, held_texts = documents(args.data, args.data_suffix, args.heldout_pct)
    return (prompts(train_texts, tokenizer, sequences, args.prompt_tokens, gen),
            prompts(held_texts, tokenizer, args.eval_sequences, args.prompt_tokens, gen)
            + function_prompts(held_texts, tokenizer, args.eval_functions, args.prompt_tokens, gen))


def documents(data: str | None, suffix: str, heldout_pct: float) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts) of the corpus."""
    root = Path(data) if data else stdlib_dir()
    if root.is_file():
        lines = root.read_text(encoding="utf-8").splitlines(keepends=True)
        named = [(f"{root.name}:{i}", "".join(lines[i:i + PIECE_LINES])) for i in range(0, len(lines), PIECE_LINES)]
    elif root.is_dir():
        named = collect_py_files(root, suffix=suffix)
    else:
        raise ValueError(f"data: {root} is neither a file nor a directory")
    train = [text for name, text in named if not is_heldout(name, heldout_pct)]
    held = [text for name, text in named if is_heldout(name, heldout_pct)]
    if not train or not held:
        raise ValueError(f"data: {root} gives {len(train)} training and {len(held)} held-out documents; both "
                         "must be non-empty (add text, or change --heldout-pct)")
    return train, held


def prompts(texts: list[str], tokenizer, n: int, length: int, gen: torch.Generator) -> list[list[int]]:
    """n prompts of `length` tokens, each from a random line of a random document (shorter ones skipped)."""
    out, tries = [], 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n:
            raise ValueError(f"data: too few documents with {length} tokens after a random line")
        text = texts[int(torch.randint(len(texts), (), generator=gen))]
        lines = text.splitlines(keepends=True)
        start = int(torch.randint(len(lines), (), generator=gen))
        ids = tokenizer.encode("".join(lines[start:])[:16 * length]).ids[:length]
        if len(ids) == length:
            out.append(ids)
    return out


def function_prompts(texts: list[str], tokenizer, n: int, length: int, gen: torch.Generator) -> list[list[int]]:
    """Up to n prompts of `length` tokens that end after a function's one-line signature and its docstring (the
    model continues with the body), chosen at random among the functions of `texts` that have `length`
    tokens before that point; fewer when there are fewer."""
    found = []
    for text in texts:
        for match in FUNCTION.finditer(text):
            ids = tokenizer.encode(text[:match.end()][-16 * length:]).ids[-length:]
            if len(ids) == length:
                found.append(ids)
    return [found[i] for i in torch.randperm(len(found), generator=gen)[:n].tolist()]


def continuations(model, prompt_ids: list[list[int]], new_tokens: int, sampled_frac: float, seed: int,
                  desc: str) -> list[tuple[int, torch.Tensor]]:
    """(prompt length, prompt + continuation) per prompt: the first (1 - sampled_frac) share greedy, the rest
    sampled at T = 1 with seed `seed + i`. Continuations end at the model's EOS. The engine decodes GEN_BATCH
    requests at a time, each exactly as alone."""
    engine = Engine(model, schedule="ar")
    n_greedy = round(len(prompt_ids) * (1 - sampled_frac))
    out = []
    with progress(len(prompt_ids), desc, unit="seq") as bar:
        for start in range(0, len(prompt_ids), GEN_BATCH):
            chunk = prompt_ids[start:start + GEN_BATCH]
            indices = range(start, start + len(chunk))
            temperatures = [0.0 if i < n_greedy else 1.0 for i in indices]
            seeds = [seed + i for i in indices]
            results = engine.generate_batch(chunk, new_tokens, temperature=temperatures, seed=seeds)
            out += [(len(prompt), torch.tensor(prompt + res.tokens, device=model.device))
                    for prompt, res in zip(chunk, results)]
            bar.update(len(chunk))
    return out
