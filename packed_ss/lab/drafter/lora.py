"""The trainable drafting adapter: PEFT-initialised LoRA on the chosen linear layers (the base stays frozen),
saved in PEFT's layout so that `load_model(path, draft_adapter=DIR)` (packed_ss/model/adapter.py) reads it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...model.adapter import PARENT, TARGETS, LoRA, adapter_dtype, peft_tensor_name

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def modules(model, targets) -> dict[str, torch.nn.Module]:
    """module path -> linear layer, for every layer and target."""
    paths = [f"model.layers.{i}.{PARENT[t]}.{t}" for i in range(model.cfg.num_layers) for t in targets]
    return {path: model.get_submodule(path) for path in paths}


def attach(model, targets, rank: int, alpha: float, gen: torch.Generator) -> list[torch.nn.Parameter]:
    """Freeze the base and put a fresh LoRA (PEFT's init: A ~ kaiming-uniform, B = 0) on every targeted
    layer; returns the trainable tensors."""
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise ValueError(f"targets must be a non-empty subset of {TARGETS}, got {list(targets)}")
    if rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank}")
    for p in model.parameters():
        p.requires_grad_(False)
    trainable = []
    for linear in modules(model, targets).values():
        bound = 1 / math.sqrt(linear.in_features)
        a = (torch.rand(rank, linear.in_features, generator=gen) * 2 - 1) * bound
        b = torch.zeros(linear.out_features, rank)
        dtype = adapter_dtype(linear.weight.dtype)
        a, b = (torch.nn.Parameter(t.to(linear.weight.device, dtype)) for t in (a, b))
        linear.lora = LoRA(a, b, alpha / rank)
        trainable += [a, b]
    return trainable


def save(model, directory: Path, targets, rank: int, alpha: float) -> None:
    """adapter_config.json (peft_type LORA) and adapter_model.safetensors with PEFT's tensor names."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, linear in modules(model, targets).items():
        tensors[peft_tensor_name(path, "A")] = linear.lora.a.detach().float().cpu().contiguous()
        tensors[peft_tensor_name(path, "B")] = linear.lora.b.detach().float().cpu().contiguous()
    save_file(tensors, directory / ADAPTER_WEIGHTS)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": False, "use_dora": False, "base_model_name_or_path": None,
              "inference_mode": True}
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
