"""Rotary position embeddings (plain, YaRN, Llama-3, ...) and the Llama-4 query scale.

Inverse frequencies and the attention factor come from transformers' own rope initialisers, so every
rope type it knows is computed exactly as the HF oracle computes it; cos/sin are evaluated in float32
as HF does, then cast to the model dtype.
"""
from __future__ import annotations

import torch

from .config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float32, attention_scaling) for the config's rope type."""
    params = cfg.rope_parameters
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = cfg.head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv = 1.0 / (params["rope_theta"] ** exponents)
        return inv, 1.0
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_type {rope_type!r} is not supported; known: {sorted(ROPE_INIT_FUNCTIONS)}")
    hf = LlamaConfig(hidden_size=cfg.num_heads * cfg.head_dim, num_attention_heads=cfg.num_heads,
                     head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
                     rope_parameters={k: v for k, v in params.items() if k != "llama_4_scaling_beta"})
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf)
    return inv.float(), float(scaling)


def rope_cos_sin(inv_freq: torch.Tensor, scaling: float, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin of shape [..., rows, head_dim] for integer positions [..., rows]."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., rows, heads, head_dim], cos / sin [..., rows, head_dim]; HF's rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


def llama4_query_scale(positions: torch.Tensor, beta: float, original_max: int, dtype) -> torch.Tensor:
    """Nemotron/Ministral3 query scale 1 + beta*log(1 + floor(pos / original_max)), keyed by absolute position."""
    scale = 1 + beta * torch.log(1 + torch.floor(positions.float() / original_max))
    return scale.to(dtype)[..., None, None]
