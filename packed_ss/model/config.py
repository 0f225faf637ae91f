"""Model configuration: the subset of a HF / Nemotron config that the engine needs."""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen3", "ministral3")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    mask_token_id: int
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    rope_parameters: dict = field(hash=False)
    qk_norm: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    llama4_scaling: tuple[float, int] | None = None   # (beta, original_max_position_embeddings)
    model_type: str = "llama"
    any_order: bool = False   # SetDLM-style: mask rows verify in any order (paper appendix C)

    @property
    def max_seq_len(self) -> int:
        """Longest sequence the engine will decode (a sliding window is not implemented, so it caps it)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def _rope_parameters(raw: dict) -> dict:
    """Rope settings in the transformers 5.x form: `rope_parameters`, or legacy `rope_theta`/`rope_scaling`."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    return params


def _llama4_scaling(rope: dict) -> tuple[float, int] | None:
    """Ministral3's query scale parameters, when the rope settings carry them."""
    beta = rope.get("llama_4_scaling_beta")
    return (float(beta), int(rope["original_max_position_embeddings"])) if beta else None


def _require(raw: dict, keys, where: str):
    missing = [k for k in keys if raw.get(k) is None]
    if missing:
        raise ValueError(f"{where}: config.json lacks required field(s) {missing}")


def is_any_order(raw: dict) -> bool:
    """SetDLM-style checkpoints: `any_order: true`, or SetDLM named as model_type / architecture."""
    names = [raw.get("model_type") or "", *(raw.get("architectures") or [])]
    return bool(raw.get("any_order")) or any("setdlm" in str(n).lower() for n in names)


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """Parse a HF `config.json` (model_type llama / mistral / qwen3 / ministral3 plus a `mask_token_id`;
    model_type setdlm is a Qwen3 backbone decoded any-order)."""
    model_type = raw.get("model_type")
    if str(model_type).lower() == "setdlm":
        model_type = "qwen3"
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{where}: unsupported model_type {model_type!r}; expected one of {SUPPORTED_MODEL_TYPES} "
            "or the Nemotron-Labs-Diffusion layout (encoder.* weights)"
        )
    if raw.get("mask_token_id") is None:
        raise ValueError(f"{where}: config.json has no mask_token_id; a dual-mode model needs one to draft")
    _require(raw, ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size"], where)
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (only 'silu', SwiGLU)")
    heads = raw["num_attention_heads"]
    rope = _rope_parameters(raw)
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        mask_token_id=raw["mask_token_id"],
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        rope_parameters=rope,
        qk_norm=model_type == "qwen3",
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
        llama4_scaling=_llama4_scaling(rope) if model_type == "ministral3" else None,
        model_type=model_type,
        any_order=is_any_order(raw),
    )


NEMOTRON_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "rms_norm_eps", "vocab_size", "mask_token_id"]


def config_from_nemotron(raw: dict, where: str) -> ModelConfig:
    """Parse a Nemotron-Labs-Diffusion config (Ministral3 backbone, YaRN + Llama-4 query scale, untied head)."""
    _require(raw, NEMOTRON_KEYS, where)
    rope = _rope_parameters(raw)
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw["num_key_value_heads"],
        head_dim=raw["head_dim"],
        intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw["rms_norm_eps"],
        mask_token_id=raw["mask_token_id"],
        eos_token_ids=_eos_ids(raw.get("eos_token_id", 11)),
        max_position_embeddings=raw.get("max_position_embeddings", 262144),
        rope_parameters=rope,
        tie_word_embeddings=False,
        llama4_scaling=_llama4_scaling(rope),
        model_type="nemotron-diffusion",
    )
