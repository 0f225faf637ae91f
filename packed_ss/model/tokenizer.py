"""Tokenizer of a model: `tokenizer.json` beside a model directory (read with the `tokenizers` library), or
the tokenizer a GGUF file describes; and the model's chat template, rendered by transformers."""
from __future__ import annotations

import json
from pathlib import Path

from . import gguf
from .sources import is_gguf, resolve_model


def load_tokenizer(path: str | Path | None = None):
    """The model's `tokenizers.Tokenizer`; `path` as `load_model` takes it (None: the embedded tiny model)."""
    from tokenizers import Tokenizer

    path = resolve_model(path)
    if is_gguf(path):
        return gguf.tokenizer(path).backend_tokenizer
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"path: no tokenizer.json in {file.parent}")
    return Tokenizer.from_file(str(file))


def chat_renderer(path: str | Path | None):
    """messages -> prompt text by the model's chat template (tokenizer_config.json's, or a GGUF file's
    tokenizer.chat_template), rendered by transformers with the assistant's turn opened; None when the model
    has no chat template."""
    path = resolve_model(path)
    if is_gguf(path):
        tokenizer = gguf.tokenizer(path)
    else:
        config = path / "tokenizer_config.json"
        if not config.is_file() or "chat_template" not in json.loads(config.read_text()):
            return None
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        return None
    return lambda messages: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
