"""Tokenizer of a model directory (`tokenizer.json`, read with the `tokenizers` library)."""
from __future__ import annotations

from pathlib import Path

from .loading import default_model_path


def load_tokenizer(path: str | Path | None = None):
    """The `tokenizers.Tokenizer` saved beside a model; `path=None` is the embedded default model."""
    from tokenizers import Tokenizer

    file = Path(path if path is not None else default_model_path()) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"path: no tokenizer.json in {file.parent}")
    return Tokenizer.from_file(str(file))
