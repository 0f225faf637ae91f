"""The model dimensions bench-scale builds, by name or from a config.json, and their scaled-down versions.

- nld-3b, nld-8b: the released `nvidia/Nemotron-Labs-Diffusion-{3B,8B}` config.json (the fields the engine
  reads, verbatim; tests/fixtures/released/ holds the files and tests/test_bench_scale.py checks them).
- nld-14b: no released config.json was at hand. Its dimensions are those of the Ministral-3 / Mistral-3-style
  14B backbone the NLD model card names, as the project's issue 21 states them (hidden 5120, 40 layers, 32
  heads, 8 KV heads, head_dim 128, intermediate 16384, vocab 131072), on the 3B/8B's NLD fields (YaRN rope,
  mask token, block 32): an assumption until a released config.json confirms it.
"""
from __future__ import annotations

import json
from pathlib import Path

NLD_3B = {
    "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
    "attention_bias": False, "block_size": 32, "bos_token_id": 1, "dlm_paradigm": "bidirectional",
    "eos_token_id": 11, "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 9216,
    "mask_token_id": 100, "max_position_embeddings": 262144, "mlp_bias": False, "num_attention_heads": 32,
    "num_hidden_layers": 26, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                        "rope_theta": 1000000.0, "rope_type": "yarn"},
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 131072,
}
CONFIGS = {
    "nld-3b": NLD_3B,
    "nld-8b": {**NLD_3B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 34},
    "nld-14b": {**NLD_3B, "hidden_size": 5120, "intermediate_size": 16384, "num_hidden_layers": 40},
}
ALIGN = 64         # scaled hidden, intermediate and vocabulary sizes are multiples of this
MIN_VOCAB = 256    # above the NLD mask (100) and EOS (11) ids


def resolve_config(text: str) -> tuple[str, dict]:
    """(name, config.json dict) for --config: a name of CONFIGS, a config.json file or a directory holding one."""
    if text in CONFIGS:
        return text, dict(CONFIGS[text])
    path = Path(text)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"--config must be one of {sorted(CONFIGS)} or a config.json file (or a directory "
                         f"holding one), got {text!r}")
    return str(file), json.loads(file.read_text())


def _aligned(value: float, low: int) -> int:
    return max(low, ALIGN * round(value / ALIGN))


def scaled(raw: dict, factor: float) -> dict:
    """`raw` shrunk by `factor` in (0, 1]: hidden, intermediate and vocabulary sizes times factor (multiples of
    64), layers and KV heads times factor (at least 1), query heads = KV heads x the original GQA ratio; head_dim
    kept. factor 1 returns the dimensions unchanged."""
    if not 0 < factor <= 1:
        raise ValueError(f"--scale must be in (0, 1], got {factor}")
    if factor == 1:
        return dict(raw)
    heads = raw["num_attention_heads"]
    kv_heads = raw.get("num_key_value_heads") or heads
    new_kv = max(1, round(kv_heads * factor))
    return {**raw, "head_dim": raw.get("head_dim") or raw["hidden_size"] // heads,
            "hidden_size": _aligned(raw["hidden_size"] * factor, ALIGN),
            "intermediate_size": _aligned(raw["intermediate_size"] * factor, ALIGN),
            "vocab_size": _aligned(raw["vocab_size"] * factor, MIN_VOCAB),
            "num_hidden_layers": max(1, round(raw["num_hidden_layers"] * factor)),
            "num_key_value_heads": new_kv, "num_attention_heads": new_kv * (heads // kv_heads)}
