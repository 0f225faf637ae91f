"""Drafting adapters: a PEFT LoRA kept unmerged and applied to the drafting rows of a call only.

Nemotron-Labs-Diffusion ships a LoRA (`linear_spec_lora/`) that its reference decoder enables for the
drafting pass and disables for prefill and verification (paper F.2). Here every linear layer of the
decoder can carry one: `y = W x` on all rows, plus `scale * B (A x)` on rows `layout.draft_from ..`, a
static slice at the end of the call. Verifier rows compute exactly the base model, so the adapter can
change which drafts are proposed (speed), never the output. No host reads, fixed shapes: the step stays
compilable and capturable in a CUDA graph.

The adapter is held and computed in at least float32 (PEFT upcasts adapter weights the same way); its
output is added in the model's dtype.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from .tensor_files import read_tensors, tensor_files

PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
TARGETS = tuple(PARENT)
NLD_ADAPTER_DIR = "linear_spec_lora"
PEFT_PREFIX = "base_model.model."
_MODULE = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)")
_TENSOR = re.compile(r"(.+)\.lora_([AB])(?:\.default)?\.weight")


def peft_tensor_name(module: str, key: str) -> str:
    """PEFT's name of a LoRA tensor: `module` a model path (model.layers.N.self_attn.q_proj), key "A" or "B"."""
    return f"{PEFT_PREFIX}{module}.lora_{key}.weight"


def adapter_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point and dtype.itemsize >= 4 else torch.float32


class LoRA(nn.Module):
    """delta(x) = scale * (x A^T) B^T with A [r, in], B [out, r]."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scale: float):
        super().__init__()
        self.register_buffer("a", a, persistent=False)
        self.register_buffer("b", b, persistent=False)
        self.scale = scale

    def _apply(self, fn, recurse=True):
        # Follow the model's device and dtype, but never below float32: keep the old values instead.
        a, b = self.a, self.b
        super()._apply(fn, recurse)
        if self.a.dtype != adapter_dtype(self.a.dtype):
            self.a, self.b = a.to(self.a.device), b.to(self.b.device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.a.dtype) @ self.a.T @ self.b.T) * self.scale


class Linear(nn.Linear):
    """nn.Linear (same parameter names) with an optional drafting adapter on rows >= draft_from (x: [..., rows,
    features], a batch of calls sharing one layout included)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.register_module("lora", None)

    def forward(self, x: torch.Tensor, draft_from: int | None = None) -> torch.Tensor:
        y = super().forward(x)
        if self.lora is not None and draft_from is not None:
            y[..., draft_from:, :] += self.lora(x[..., draft_from:, :]).to(y.dtype)
        return y


def find_adapter(path: Path, raw: dict) -> Path | None:
    """The adapter a model directory ships: the one its config.json names (`draft_adapter`, a path relative
    to the directory), else Nemotron-Labs-Diffusion's `linear_spec_lora/`, else none."""
    declared = raw.get("draft_adapter")
    if declared is not None:
        adapter = path / declared
        if not (adapter / "adapter_config.json").is_file():
            raise ValueError(f"{path / 'config.json'}: draft_adapter {declared!r} is not an adapter directory "
                             f"(no {adapter / 'adapter_config.json'})")
        return adapter
    default = path / NLD_ADAPTER_DIR
    return default if (default / "adapter_config.json").is_file() else None


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern: the first key that matches the end of the module name."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _targeted(config: dict, module: str, layer: int) -> bool:
    targets = config["target_modules"]
    if isinstance(targets, str):
        hit = re.fullmatch(targets, module) is not None
    else:
        hit = any(module == t or module.endswith("." + t) for t in targets)
    layers = config.get("layers_to_transform")
    if isinstance(layers, int):
        layers = [layers]
    return hit and (layers is None or layer in layers)


def _read_config(file: Path) -> dict:
    if not file.is_file():
        raise ValueError(f"draft_adapter: {file.parent} has no adapter_config.json")
    config = json.loads(file.read_text())
    unsupported = {"peft_type": config.get("peft_type", "LORA") != "LORA", "use_dora": config.get("use_dora"),
                   "fan_in_fan_out": config.get("fan_in_fan_out"), "lora_bias": config.get("lora_bias"),
                   "bias": config.get("bias", "none") != "none", "layer_replication": config.get("layer_replication")}
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"{file}: {', '.join(f'{k}={config.get(k)!r}' for k in bad)} not supported "
                         "(a plain LoRA is: peft_type LORA, no DoRA, no bias, fan_in_fan_out false)")
    targets = config.get("target_modules")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    unknown = [t for t in names if isinstance(targets, list) and t.rsplit(".", 1)[-1] not in TARGETS]
    if not names or unknown:
        raise ValueError(f"{file}: target_modules {unknown or targets!r} not supported; a drafting adapter may "
                         f"target {TARGETS}")
    return config


def load_adapter(model: nn.Module, directory: str | Path, rename=lambda name: name) -> None:
    """Attach the PEFT LoRA adapter in `directory` to `model`'s linear layers, unmerged.

    `rename` maps a PEFT module path (after `base_model.model.`) to the model's names (e.g. `encoder.` ->
    `model.` for Nemotron-Labs-Diffusion).
    """
    directory = Path(directory)
    config = _read_config(directory / "adapter_config.json")
    files = tensor_files(directory, "adapter_model")
    found: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}   # module -> "A" / "B" -> (stored name, tensor)
    n_layers = model.cfg.num_layers
    for name, tensor in read_tensors(files):
        match = _TENSOR.fullmatch(name.removeprefix(PEFT_PREFIX))
        module = rename(match.group(1)) if match else ""
        where = _MODULE.fullmatch(module)
        if not (match and where and where.group(2) in TARGETS):
            raise ValueError(f"{files[0]}: tensor {name} is not a LoRA weight of a decoder linear layer "
                             f"({', '.join(TARGETS)})")
        if int(where.group(1)) >= n_layers:
            raise ValueError(f"{files[0]}: tensor {name} adapts layer {where.group(1)}, but the base model has "
                             f"{n_layers} layers (0..{n_layers - 1}): the adapter belongs to another model")
        found.setdefault(module, {})[match.group(2)] = (name, tensor)
    expected = {m for i in range(n_layers) for t in TARGETS
                if _targeted(config, m := f"model.layers.{i}.{PARENT[t]}.{t}", i)}
    missing = sorted(expected - {m for m, ab in found.items() if len(ab) == 2})
    if missing:
        raise ValueError(f"{files[0]}: lacks lora_A / lora_B for {missing[:4]} (adapter_config.json targets "
                         f"{len(expected)} modules of this {n_layers}-layer model)")
    extra = sorted(set(found) - expected)
    if extra:
        raise ValueError(f"{files[0]}: tensors for {extra[:4]}, which adapter_config.json does not target")
    for module, ab in found.items():
        linear = model.get_submodule(module)
        peft_module = _TENSOR.fullmatch(ab["A"][0].removeprefix(PEFT_PREFIX)).group(1)   # the name PEFT matched
        r = _pattern_value(config.get("rank_pattern") or {}, peft_module, config["r"])
        alpha = _pattern_value(config.get("alpha_pattern") or {}, peft_module, config["lora_alpha"])
        for key, shape in (("A", (r, linear.in_features)), ("B", (linear.out_features, r))):
            name, tensor = ab[key]
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{files[0]}: tensor {name} has shape {tuple(tensor.shape)}, expected {shape} "
                                 f"(r={r}, base weight {tuple(linear.weight.shape)})")
        scale = alpha / (r ** 0.5 if config.get("use_rslora") else r)
        dtype = adapter_dtype(linear.weight.dtype)
        linear.lora = LoRA(*(ab[k][1].to(linear.weight.device, dtype) for k in "AB"), scale)
