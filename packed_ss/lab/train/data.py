"""Training data: the corpus of `.py` files, its train / held-out split, the byte-level BPE tokenizer trained
on it, and the token streams cut into training batches and held-out windows.

Corpus: the `.py` files of the running interpreter's standard library (site-packages excluded) or of
--data-dir, split by a hash of the relative path. Tokenizer: byte-level BPE with `<|endoftext|>` (EOS, also
BOS / PAD) = 0 and `<|mask|>` = 1.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN]  # ids 0 and 1
EOS_ID = 0
MASK_ID = 1


def add_corpus_args(ap: argparse.ArgumentParser) -> None:
    """The corpus options that `load_corpus` reads (both trainers take them)."""
    ap.add_argument("--data-dir", default=None, help="corpus root (default: the interpreter's stdlib)")
    ap.add_argument("--max-files", type=int, default=None)
    ap.add_argument("--heldout-pct", type=float, default=3.0)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def collect_py_files(root: Path, max_files: int | None = None, suffix: str = ".py") -> list[tuple[str, str]]:
    """All ``*.py`` files (or files ending in `suffix`) under ``root`` (no site-packages / __pycache__), as
    (relative posix path, text), sorted by path. Files that are not valid UTF-8 (a few deliberately broken
    test inputs) are skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for fn in sorted(filenames):
            if not fn.endswith(suffix):
                continue
            p = Path(dirpath) / fn
            try:
                text = p.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not text.strip():
                continue
            out.append((p.relative_to(root).as_posix(), text))
    out.sort(key=lambda t: t[0])
    if max_files is not None:
        out = out[:max_files]
    return out


def is_heldout(relpath: str, heldout_pct: float) -> bool:
    """Held out iff sha1(relative path) mod 10000 < 100 x heldout_pct: stable across machines and runs."""
    h = int.from_bytes(hashlib.sha1(relpath.encode("utf-8")).digest()[:8], "big")
    return (h % 10000) < heldout_pct * 100


def load_corpus(args) -> tuple[Path, list[tuple[str, str]], list[tuple[str, str]]]:
    """(corpus root, train files, held-out files) for --data-dir, --max-files and --heldout-pct."""
    root = Path(args.data_dir) if args.data_dir else stdlib_dir()
    files = collect_py_files(root, args.max_files)
    train = [f for f in files if not is_heldout(f[0], args.heldout_pct)]
    held = [f for f in files if is_heldout(f[0], args.heldout_pct)]
    if not held:
        raise SystemExit("no held-out files: raise --heldout-pct or add files")
    return root, train, held


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenization, no normalizer, no prefix space): lossless on any text,
    so indented Python round-trips exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS_TOKEN) == EOS_ID and tok.token_to_id(MASK_TOKEN) == MASK_ID
    return tok


def wrap_tokenizer(tok):
    """The `tokenizers.Tokenizer` as the transformers tokenizer saved beside the model."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def encode_stream(tok, texts: list[str]) -> torch.Tensor:
    """The documents' token ids, concatenated with an EOS after each one (int32)."""
    ids = []
    for e in tok.encode_batch(texts):
        ids.extend(e.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.int32)


def heldout_sample(stream: torch.Tensor, n: int, T: int) -> torch.Tensor:
    """n fixed, evenly spaced, non-overlapping windows of T tokens from the held-out stream."""
    n_chunks = len(stream) // T
    n = min(n, n_chunks)
    if n == 0:
        raise ValueError("held-out stream shorter than one sequence")
    idx = torch.linspace(0, n_chunks - 1, n).round().long()
    return torch.stack([stream[i * T:(i + 1) * T] for i in idx.tolist()]).long()


def epoch_batches(stream: torch.Tensor, T: int, bsz: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Batches [bsz, T] of the stream's chunks of T tokens in a random order, drawn anew every epoch (the
    dual-mode trainer's data order; it passes the stream from a random offset)."""
    n_chunks = len(stream) // T
    order, cursor = torch.randperm(n_chunks, generator=gen), 0
    while True:
        if cursor + bsz > n_chunks:
            order, cursor = torch.randperm(n_chunks, generator=gen), 0
        idx = order[cursor:cursor + bsz].tolist()
        cursor += bsz
        yield torch.stack([stream[i * T:(i + 1) * T] for i in idx]).long()


def cyclic_batches(stream: torch.Tensor, T: int, bsz: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Batches [bsz, T] of the stream's chunks of T tokens, read in one random order by a window of bsz
    chunks that moves bsz a step and wraps around (the any-order trainer's data order)."""
    n_chunks = len(stream) // T
    order = torch.randperm(n_chunks, generator=gen)
    step = 0
    while True:
        idx = order[(step * bsz) % (n_chunks - bsz):][:bsz].tolist()
        step += 1
        yield torch.stack([stream[i * T:(i + 1) * T] for i in idx]).long()
