"""Model configuration: the subset of a checkpoint's config.json that the engine needs.

The family comes from the config (`model_type`, `architectures`), never from weight names:
- llama, mistral, qwen3 (per-head q/k RMSNorm), ministral3 (YaRN plus the Llama-4 query scale): HF
  directories; with a `mask_token_id` they draft by diffusion, without one they are causal models that
  decode with AR or lookup drafts alone;
- nemotron_labs_diffusion: Nemotron-Labs-Diffusion, a Ministral3 backbone stored as `encoder.*` with an
  untied `diffusion_head`;
- SetDLM (`architectures` ["SetDLM"]): a Qwen3 backbone decoded any-order, whose mask token is never
  predicted (its logit is -inf on every row, as the authors' denoiser does).
"""
from __future__ import annotations

from dataclasses import dataclass, field

HF_FAMILIES = ("llama", "mistral", "qwen3", "ministral3")
NLD = "nemotron_labs_diffusion"
SETDLM = "setdlm"
FAMILIES = (*HF_FAMILIES, NLD, SETDLM)


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
    mask_token_id: int | None   # None: no drafting mode (a causal checkpoint)
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    rope_parameters: dict = field(hash=False)
    qk_norm: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    llama4_scaling: tuple[float, int] | None = None   # (beta, original_max_position_embeddings)
    model_type: str = "llama"   # the family, one of FAMILIES
    any_order: bool = False   # SetDLM-style: mask rows verify in any order (paper appendix C)
    suppress_mask_logit: bool = False   # SetDLM: the mask token's logit is -inf on every row
    block_size: int | None = None   # the block the model was trained to draft (the default width is B - 1)
    torch_dtype: str | None = None  # the checkpoint's dtype ("bfloat16", ...): the default on CUDA

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


def family(raw: dict, where: str) -> str:
    """The model family named by `model_type` / `architectures` (see the module docstring)."""
    model_type = str(raw.get("model_type") or "").lower()
    architectures = [str(a) for a in raw.get("architectures") or []]
    if "SetDLM" in architectures or model_type == SETDLM:
        return SETDLM
    if model_type == NLD or "NemotronLabsDiffusionModel" in architectures:
        return NLD
    if model_type in HF_FAMILIES:
        return model_type
    if model_type in ("bd3lm", "mdlm"):
        raise ValueError(f"{where}: model_type {model_type!r} with architectures {architectures}: of the "
                         "kuleshov-group denoisers only SetDLM (architectures ['SetDLM']) is supported")
    raise ValueError(f"{where}: unsupported model_type {model_type or None!r} (architectures {architectures}); "
                     f"supported: {FAMILIES}")


def _torch_dtype(raw: dict) -> str | None:
    dtype = raw.get("torch_dtype") or raw.get("dtype")
    return str(dtype).removeprefix("torch.") if dtype else None


def _check(raw: dict, where: str, kind: str) -> None:
    """Refuse what the network does not implement."""
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: model_type {kind!r} with hidden_act {act!r} is not supported (only 'silu', SwiGLU)")
    paradigm = raw.get("dlm_paradigm", "bidirectional")
    if kind == NLD and paradigm != "bidirectional":
        raise ValueError(f"{where}: model_type {kind!r} with dlm_paradigm {paradigm!r} is not supported (only "
                         "'bidirectional': mask rows of a block see each other)")
    if raw.get("mask_token_id") is None and (kind == SETDLM or raw.get("any_order")):
        raise ValueError(f"{where}: config.json has no mask_token_id; an any-order model needs one to draft")
    _require(raw, ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size"], where)


def model_config(raw: dict, where: str) -> ModelConfig:
    """Parse a config.json; a SetDLM wrapper must first be resolved to its backbone (setdlm.py)."""
    kind = family(raw, where)
    _check(raw, where, kind)
    heads = raw["num_attention_heads"]
    rope = _rope_parameters(raw)
    scaled = kind in ("ministral3", NLD)
    return ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        intermediate_size=raw["intermediate_size"],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        mask_token_id=raw.get("mask_token_id"),
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        rope_parameters=rope,
        qk_norm=kind in ("qwen3", SETDLM),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
        llama4_scaling=_llama4_scaling(rope) if scaled else None,
        model_type=kind,
        any_order=kind == SETDLM or bool(raw.get("any_order")),   # any_order: the shipped any-order model
        suppress_mask_logit=kind == SETDLM,
        block_size=raw.get("block_size"),
        torch_dtype=_torch_dtype(raw),
    )
