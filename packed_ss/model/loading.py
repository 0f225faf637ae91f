"""Load a dual-mode checkpoint from a local directory (HF layout or Nemotron-Labs-Diffusion layout)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .config import config_from_hf, config_from_nemotron
from .dual_mode import DualModeModel

NEMOTRON_PREFIX = "encoder."
NEMOTRON_HEAD = "diffusion_head.weight"


def default_model_path(kind: str = "default") -> Path:
    """Directory of a model shipped inside the package (tokenizer included)."""
    path = Path(__file__).parents[1] / "assets" / kind
    if not (path / "config.json").is_file():
        raise ValueError(f"kind: no shipped model named {kind!r} (looked in {path})")
    return path


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path: no *.safetensors files in {path}")
    tensors = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _nemotron_to_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """encoder.* -> model.*, diffusion_head.weight -> lm_head.weight (the untied head of both modes)."""
    out = {}
    for name, t in tensors.items():
        if name == NEMOTRON_HEAD:
            out["lm_head.weight"] = t
        elif name.startswith(NEMOTRON_PREFIX):
            out["model." + name[len(NEMOTRON_PREFIX):]] = t
        else:
            out[name] = t
    return out


def mask_token_from_tokenizer(path: Path) -> int | None:
    """The id of the tokenizer's mask token (SetDLM checkpoints name it there, not in config.json)."""
    tc_path, tok_path = path / "tokenizer_config.json", path / "tokenizer.json"
    if not (tc_path.is_file() and tok_path.is_file()):
        return None
    mask = json.loads(tc_path.read_text()).get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    added = json.loads(tok_path.read_text()).get("added_tokens", [])
    return next((t["id"] for t in added if mask is not None and t["content"] == mask), None)


def load_model(path: str | Path | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> DualModeModel:
    """Load a model directory; `path=None` loads the embedded default model."""
    path = Path(path) if path is not None else default_model_path()
    if not (path / "config.json").is_file():
        raise ValueError(f"path: {path} has no config.json")
    raw = json.loads((path / "config.json").read_text())
    if raw.get("mask_token_id") is None:
        raw["mask_token_id"] = mask_token_from_tokenizer(path)
    tensors = _read_tensors(path)
    if NEMOTRON_HEAD in tensors or any(n.startswith(NEMOTRON_PREFIX) for n in tensors):
        cfg = config_from_nemotron(raw, str(path))
        tensors = _nemotron_to_hf(tensors)
    else:
        cfg = config_from_hf(raw, str(path))
    with torch.device("meta"):
        model = DualModeModel(cfg)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"path: {path} lacks weight(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"path: {path} has unexpected weight(s) {unexpected[:8]}")
    for name, t in expected.items():
        if tuple(tensors[name].shape) != tuple(t.shape):
            raise ValueError(f"path: weight {name} has shape {tuple(tensors[name].shape)}, "
                             f"config implies {tuple(t.shape)}")
    model.load_state_dict({n: tensors[n].to(dtype) for n in expected}, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()
