"""Load a dual-mode checkpoint from a local directory or a GGUF file, streaming its tensors into the model.

The family comes from config.json (config.py); its on-disk names map onto the model's HF names:
Nemotron-Labs-Diffusion's `encoder.*` / `diffusion_head.weight`, the SetDLM wrapper's `backbone.model.*`
(setdlm.py), or HF names as they are. The model is built on the meta device and each tensor is read,
cast and placed on the target device one at a time, so a load holds the model plus one tensor.
A drafting adapter shipped with the model (adapter.py) is attached unless `draft_adapter=None`.
A GGUF file of a llama-family model (gguf.py) loads through the same build, de-quantized to the dtype asked for.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from ..dtype import AUTO, faster_dtype
from ..width import read_profile
from . import gguf, setdlm
from .adapter import find_adapter, load_adapter
from .config import NLD, ModelConfig, family, model_config
from .dual_mode import DualModeModel
from .sources import default_model_path, is_gguf, resolve_model, shipped_adapter
from .tensor_files import read_tensors, tensor_files

__all__ = ["DTYPES", "DTYPE_NAMES", "dtype_named", "dtype_said", "default_model_path", "load_model", "random_model"]


def nld_name(name: str) -> str:
    """Nemotron-Labs-Diffusion: encoder.* -> model.*, diffusion_head.weight -> lm_head.weight (the untied
    head of both modes)."""
    if name == "diffusion_head.weight":
        return "lm_head.weight"
    return "model." + name.removeprefix("encoder.") if name.startswith("encoder.") else name


DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}   # the dtypes a model loads in, by the names the CLIs take
DTYPE_NAMES = (*DTYPES, AUTO)         # what a CLI's --dtype takes


def dtype_named(name: str | None) -> torch.dtype | str | None:
    """load_model's dtype for a CLI's --dtype: a name in DTYPES, "auto", or None (the default)."""
    return DTYPES.get(name, name)


def dtype_said(model) -> str:
    """The loaded dtype and how it was chosen, for a CLI to print."""
    return f"{str(model.dtype).removeprefix('torch.')} ({model.dtype_source})"


def default_dtype(cfg: ModelConfig, device) -> torch.dtype:
    """The checkpoint's own dtype on CUDA, float32 elsewhere (half precision is slow on CPUs)."""
    if torch.device(device).type != "cuda" or cfg.torch_dtype is None:
        return torch.float32
    dtype = getattr(torch, cfg.torch_dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"config.json: torch_dtype {cfg.torch_dtype!r} is not a floating torch dtype")
    return dtype


def _fill(model: DualModeModel, tensors: Iterator[tuple[str, torch.Tensor]], rename, device, dtype,
          where: str) -> None:
    """Place every tensor into the meta-built model; name the first missing, surplus or misshaped one."""
    params = dict(model.named_parameters())     # a tied head appears once, as the embedding
    loaded, unexpected = set(), []
    for stored, tensor in tensors:
        name = rename(stored)
        if name is None or (model.cfg.tie_word_embeddings and name == "lm_head.weight"):
            continue
        if name not in params:
            unexpected.append(stored)
            continue
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise ValueError(f"{where}: weight {stored} has shape {tuple(tensor.shape)}, "
                             f"config implies {tuple(params[name].shape)}")
        owner, leaf = name.rsplit(".", 1)
        module = model.get_submodule(owner)
        module._parameters[leaf] = nn.Parameter(tensor.to(device, dtype), requires_grad=params[name].requires_grad)
        loaded.add(name)
    qk_norm = [n for n in unexpected if ".q_norm." in n or ".k_norm." in n]
    if qk_norm:
        raise ValueError(f"{where}: model_type {model.cfg.model_type!r} has no per-head q/k RMSNorm, but the "
                         f"weights carry it ({qk_norm[0]}); q/k-norm is implemented for qwen3 and SetDLM only")
    if unexpected:
        raise ValueError(f"{where}: unexpected weight(s) {unexpected[:8]} for model_type {model.cfg.model_type!r}")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{where}: lacks weight(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")


def _build(cfg: ModelConfig, tensors_of, rename, device, dtype, where: str) -> DualModeModel:
    """The model of `cfg` built on the meta device and filled with `tensors_of(meta model)`, on `device`."""
    with torch.device("meta"):
        model = DualModeModel(cfg)
    _fill(model, tensors_of(model), rename, device, dtype, where)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def load_model(path: str | Path | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype | str | None = None, draft_adapter: str | Path | None = "auto") -> DualModeModel:
    """Load a model directory, a GGUF file or a named model (sources.py: 'tiny', 'any-order', 'smollm2-135m');
    `path=None` loads the embedded tiny model.

    `dtype`: default the config's `torch_dtype` on CUDA, float32 on the CPU (a GGUF file names none: float32);
    "auto" is the default on CUDA and on a CPU the faster of float32 and bfloat16 here (packed_ss/dtype.py),
    said in `model.dtype_source`.
    `draft_adapter`: "auto" attaches the drafting LoRA the directory ships (`linear_spec_lora/`, or the
    directory config.json's `draft_adapter` names) or the one this package ships for a packaged model's GGUF
    file (sources.shipped_adapter), a path attaches that PEFT adapter, None none. It applies
    to drafting rows only. The drafter's acceptance profile (width="auto") is read from the adapter's
    directory, or without an adapter from the model's.
    """
    path = resolve_model(path)
    if is_gguf(path):
        raw, rename, home = gguf.config(path), (lambda name: name), None   # a bare file: nothing ships beside it
    else:
        (raw, rename), home = _directory_config(path), path
    cfg = model_config(raw, str(path))
    if not (dtype is None or dtype == AUTO or isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch dtype, 'auto' or None, got {dtype!r}")
    measure = dtype == AUTO and torch.device(device).type != "cuda"
    source = "asked for" if isinstance(dtype, torch.dtype) else "default"
    dtype = torch.float32 if measure else default_dtype(cfg, device) if dtype in (None, AUTO) else dtype
    tensors = read_tensors(tensor_files(path)) if home is not None else gguf.tensors(path, raw, dtype)   # lazy
    model = _build(cfg, lambda _: tensors, rename, device, dtype, str(path))
    model.dtype_source = source
    if measure:
        chosen, model.dtype_source = faster_dtype(model)
        model = model.to(chosen)
    if draft_adapter == "auto":
        draft_adapter = find_adapter(home, raw) if home is not None else shipped_adapter(path)
    if draft_adapter is not None:
        load_adapter(model, draft_adapter, rename)
    model.adapter_dir = None if draft_adapter is None else Path(draft_adapter)
    profile_home = draft_adapter if draft_adapter is not None else home
    model.draft_profile = read_profile(profile_home) if profile_home is not None else None
    return model


def _directory_config(path: Path) -> tuple[dict, object]:
    """A model directory's config.json (a SetDLM wrapper resolved to its backbone, the mask token from the
    tokenizer when the config names none) and the map from its weight names to the model's."""
    if not (path / "config.json").is_file():
        raise ValueError(f"path: {path} has no config.json")
    raw = json.loads((path / "config.json").read_text())
    kind = family(raw, str(path))
    if setdlm.is_wrapper(raw):
        raw, rename = setdlm.resolve(raw, path), setdlm.weight_name
    else:
        rename = nld_name if kind == NLD else (lambda name: name)
    if raw.get("mask_token_id") is None:
        raw["mask_token_id"] = setdlm.mask_token_from_tokenizer(path)
    return raw, rename


def random_model(cfg: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 std: float = 0.02, seed: int = 0) -> DualModeModel:
    """A model of `cfg`'s dimensions with random weights, each made directly on `device` in `dtype` (built on
    the meta device, so nothing passes through the host or float32: an 8B model in bfloat16 in seconds).
    Matrices and embeddings are normal(0, std), norm weights one, so activations and logits stay finite."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def tensors(model):
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                yield name, torch.ones(p.shape, device=device, dtype=dtype)
            else:
                yield name, torch.randn(p.shape, device=device, dtype=dtype, generator=gen).mul_(std)
    return _build(cfg, tensors, lambda name: name, device, dtype, "random weights")
