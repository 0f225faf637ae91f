"""GGUF files (llama.cpp's format) of llama-family models: config, weights and tokenizer, all read by
transformers' GGUF support, which de-quantizes with the `gguf` package and undoes the permutation of the
Q/K projections that llama.cpp's converter applies. What transformers builds from the file is therefore
what the engine runs.

A file is checked before anything reads it in bulk: a file transformers cannot parse, one shorter than its
tensor table says, one of an architecture other than llama (llama.cpp also writes Mistral as llama), or one
without a tokenizer is a ValueError that names the file. The tokenizer, the chat template and the stop
token come from the file's metadata too.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

ARCHITECTURES = ("llama",)      # `general.architecture` values that load
UNUSED, CONTROL = 5, 3          # llama.cpp's token types (gguf.TokenType)


@contextmanager
def _reading(file: Path, what: str):
    """Any failure of a third-party reader on `file` as one ValueError that names the file."""
    try:
        yield
    except ImportError as err:
        raise ValueError(f"{file}: reading GGUF files needs the gguf package (pip install gguf) and a transformers "
                         f"release with GGUF support ({err})") from None
    except Exception as err:  # noqa: BLE001 - a damaged file can fail anywhere inside the readers
        raise ValueError(f"{file}: {what} failed ({type(err).__name__}: {err})") from None


def metadata(file: Path) -> dict:
    """The file's metadata (arrays as their lengths), once the file is known to be whole, of a supported
    architecture and to carry a tokenizer."""
    with _reading(file, "reading it as GGUF"):
        from transformers.integrations.gguf.reader import GgufHeader, read_gguf_metadata

        header = GgufHeader.from_file(str(file))
        meta, _ = read_gguf_metadata(str(file))
    end = header.data_start + max((t.offset + t.nbytes for t in header.tensors), default=0)
    size = file.stat().st_size
    if size < end:
        raise ValueError(f"{file}: truncated GGUF file: {size} bytes, its tensor table needs {end}")
    architecture = meta.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{file}: GGUF architecture {architecture!r} is not supported; supported: {ARCHITECTURES}")
    if not meta.get("tokenizer.ggml.tokens"):
        raise ValueError(f"{file}: the GGUF file has no tokenizer (no tokenizer.ggml.tokens in its metadata); "
                         "the tokenizer, chat template and stop token must come from the file")
    return meta


def mask_token(tokenizer: dict, chat_template: str | None) -> int | None:
    """The token fed to drafting rows. A GGUF model has no drafting mode and so no mask token; the stand-in is a
    token the model neither reads nor writes in use, so that the drafting rows carry no meaning of their own:
    the first token llama.cpp marks UNUSED, else the last CONTROL token that has no special role (BOS, EOS,
    unknown, padding) and that the chat template does not write. For SmolLM2-135M-Instruct that is
    `<empty_output>` (id 16), the code pre-training marker of an empty Jupyter cell output, which its chat
    template never writes. None when the vocabulary has neither: the model then decodes as a causal model
    (AR and lookup)."""
    tokens, types = tokenizer["tokens"], tokenizer.get("token_type") or []
    unused = [i for i, kind in enumerate(types) if kind == UNUSED]
    if unused:
        return unused[0]
    roles = {tokenizer.get(k) for k in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id")}
    free = [i for i, kind in enumerate(types)
            if kind == CONTROL and i not in roles and tokens[i] not in (chat_template or "")]
    return free[-1] if free else None


def config(file: Path) -> dict:
    """The model's config.json as transformers reads it from the metadata, with `mask_token_id` (mask_token).
    Its `eos_token_id` is the file's (SmolLM2-Instruct: `<|im_end|>`, the end of a chat turn)."""
    metadata(file)
    with _reading(file, "reading its config and tokenizer"):
        from transformers import AutoConfig
        from transformers.integrations.gguf import get_gguf_tokenizer

        raw = AutoConfig.from_pretrained(file.parent, gguf_file=file.name).to_dict()
        _, tokenizer, tokenizer_config = get_gguf_tokenizer(str(file))
    return raw | {"mask_token_id": mask_token(tokenizer, tokenizer_config.get("chat_template"))}


def tensors(file: Path, raw: dict, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights under transformers' names, de-quantized to `dtype`, Q/K in transformers' order: transformers'
    own GGUF load, given a skeleton of the model (built on the meta device) for the names. Each tensor is
    dropped from the load's dictionary as it is handed on."""
    with _reading(file, "de-quantizing its tensors"):
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.for_model(**raw))
        weights = load_gguf_checkpoint(str(file), return_tensors=True, model_to_load=skeleton,
                                       torch_dtype=dtype)["tensors"]
    while weights:
        yield weights.popitem()


def tokenizer(file: Path):
    """The transformers tokenizer the file describes (vocabulary, merges, special tokens, chat template)."""
    metadata(file)
    with _reading(file, "building its tokenizer"):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(file.parent), gguf_file=file.name)
