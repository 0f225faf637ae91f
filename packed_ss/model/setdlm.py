"""SetDLM checkpoints as the authors' code (kuleshov-group/setdlms) saves them, and their conversion.

`save_pretrained_or_push_to_hub` writes the denoiser wrapper: a config.json with model_type "bd3lm",
architectures ["SetDLM"], `mask_token_id`, `vocab_size` = the tokenizer's length (the backbone embeds more
rows) and a hydra `backbone_config` that names the Qwen3 base (`pretrained_model_name_or_path`, the
`num_layers` kept) but no dimensions; one `pytorch_model.bin` (safe_serialization=False) with keys
`backbone.model.model.*` and `backbone.model.lm_head.weight` (a tied head saved under both) plus the
`static_attention_mask` buffer, which is not a weight; the tokenizer, whose mask token the denoiser uses.
The dimensions come from the base model's own config.json: a local directory or the local HF cache.

`convert` writes the same tensors as an HF-style safetensors directory (architectures ["SetDLM"], the
dimensions inline) that loads without the base model.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors.torch import save_file

from .config import family, model_config
from .tensor_files import read_tensors, tensor_files

BACKBONE = "backbone.model."
NOT_WEIGHTS = ("static_attention_mask",)
TOKENIZER_SUFFIXES = (".json", ".txt", ".model", ".tiktoken")


def is_wrapper(raw: dict) -> bool:
    return "backbone_config" in raw


def weight_name(name: str) -> str | None:
    """The model's name for a wrapper key (None: a buffer that is not a weight)."""
    if name in NOT_WEIGHTS:
        return None
    if name.startswith("model." + BACKBONE):      # a composer checkpoint's state.model
        name = name.removeprefix("model.")
    if name.startswith(BACKBONE + "model."):
        return "model." + name[len(BACKBONE + "model."):]
    return name.removeprefix(BACKBONE)      # backbone.model.lm_head.weight -> lm_head.weight


def mask_token_from_tokenizer(path: Path) -> int | None:
    """The id of the tokenizer's mask token (`mask_token` in tokenizer_config.json, id in tokenizer.json)."""
    tc_path, tok_path = path / "tokenizer_config.json", path / "tokenizer.json"
    if not (tc_path.is_file() and tok_path.is_file()):
        return None
    mask = json.loads(tc_path.read_text()).get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    added = json.loads(tok_path.read_text()).get("added_tokens", [])
    return next((t["id"] for t in added if mask is not None and t["content"] == mask), None)


def _hf_cache_snapshot(repo_id: str) -> Path | None:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    repo = Path(hub) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    snapshots = [repo / "snapshots" / ref.read_text().strip()] if ref.is_file() else []
    snapshots += sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return next((s for s in snapshots if (s / "config.json").is_file()), None)


def base_directory(raw: dict, path: Path, backbone: str | Path | None = None) -> Path:
    """The directory with the base model's config.json: `backbone` if given, else the wrapper's
    `backbone_config.pretrained_model_name_or_path` as a local directory or an id in the local HF cache."""
    name = (raw.get("backbone_config") or {}).get("pretrained_model_name_or_path")
    candidates = [Path(backbone)] if backbone is not None else []
    if name:
        candidates += [Path(name).expanduser(), path / name]
    found = next((c for c in candidates if (c / "config.json").is_file()), None)
    found = found or (_hf_cache_snapshot(name) if name and backbone is None else None)
    if found is None:
        raise ValueError(
            f"{path / 'config.json'}: backbone_config.pretrained_model_name_or_path {name!r} is neither a local "
            "directory with a config.json nor in the local Hugging Face cache; fetch its config.json (e.g. "
            f"`huggingface-cli download {name} config.json`), or write a self-contained copy with "
            f"`python -m packed_ss convert setdlm {path} DST --backbone BASE_DIR`")
    return found


def resolve(raw: dict, path: Path, backbone: str | Path | None = None) -> dict:
    """The wrapper's config as a full HF-style SetDLM config: the base's dimensions, the kept layers, the
    wrapper's tokens (the mask token from the tokenizer)."""
    base_dir = base_directory(raw, path, backbone)
    base = json.loads((base_dir / "config.json").read_text())
    if family(base, str(base_dir)) != "qwen3":
        raise ValueError(f"{base_dir / 'config.json'}: a SetDLM backbone is Qwen3, got model_type "
                         f"{base.get('model_type')!r}")
    layers = (raw.get("backbone_config") or {}).get("num_layers", -1)
    if layers in (-1, None):
        layers = base["num_hidden_layers"]
    if not 1 <= layers <= base["num_hidden_layers"]:
        raise ValueError(f"{path / 'config.json'}: backbone_config.num_layers {layers} not in "
                         f"[1, {base['num_hidden_layers']}] (the layers of {base_dir})")
    mask, declared = mask_token_from_tokenizer(path), raw.get("mask_token_id")
    if mask is not None and declared is not None and mask != declared:
        raise ValueError(f"{path}: the tokenizer's mask token is id {mask}, config.json says mask_token_id {declared}")
    resolved = {k: v for k, v in base.items() if k not in ("architectures", "auto_map")}
    resolved.update(architectures=["SetDLM"], num_hidden_layers=layers,
                    mask_token_id=mask if mask is not None else declared)
    for key in ("eos_token_id", "bos_token_id", "block_size"):
        if raw.get(key) is not None:
            resolved[key] = raw[key]
    return resolved


def convert(src: str | Path, dst: str | Path, backbone: str | Path | None = None,
            unsafe_pickle: bool = False) -> Path:
    """Write the SetDLM checkpoint in `src` (the authors' wrapper layout) to `dst` as safetensors."""
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise ValueError(f"src: {src} has no config.json")
    raw = json.loads((src / "config.json").read_text())
    if family(raw, str(src)) != "setdlm":
        raise ValueError(f"src: {src} is not a SetDLM checkpoint (architectures {raw.get('architectures')})")
    config = resolve(raw, src, backbone) if is_wrapper(raw) else raw
    cfg = model_config(config, str(src))
    tensors = {}
    for name, tensor in read_tensors(tensor_files(src), unsafe_pickle):
        name = weight_name(name)
        if name is not None and not (cfg.tie_word_embeddings and name == "lm_head.weight"):
            tensors[name] = tensor.contiguous()
    config["torch_dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in src.iterdir():
        if file.is_file() and file.suffix in TOKENIZER_SUFFIXES and file.name != "config.json":
            shutil.copy2(file, dst / file.name)
    return dst
