"""The networks the trainers start from: a fresh dual-mode Llama, or a Qwen3 any-order network warm-started
from a saved checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .data import EOS_ID, MASK_ID


def new_dual_mode_model(args, vocab_size: int):
    """A freshly initialised LlamaForCausalLM (fp32, tied embeddings) of the shape the options give, seeded
    by --seed. With --zero-init-out (the default) the residual-branch outputs (attention o_proj, MLP
    down_proj) start at zero, so every block starts as the identity, which speeds up the first few hundred
    steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_pos,
        rope_theta=args.rope_theta,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        initializer_range=0.02,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        mask_token_id=MASK_ID,
        use_cache=True,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    if args.zero_init_out:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.zero_()
    return model


def any_order_model_from(init: Path, seed: int):
    """Qwen3ForCausalLM (config `any_order: true`) with the shapes and weights of the Llama- or Qwen3-layout
    checkpoint `init`; q/k norms absent from it start at 1."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    raw = json.loads((init / "config.json").read_text())
    keep = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id", "rope_parameters"]
    config = Qwen3Config(**{k: raw[k] for k in keep if k in raw}, any_order=True, use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_file(init / "model.safetensors"), strict=False)
    if unexpected or any("norm" not in n and n != "lm_head.weight" for n in missing):
        raise SystemExit(f"--init-from {init}: weights do not fit (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    return model
