"""Scaled-down copies of released checkpoints, written the way their authors write them.

Nemotron-Labs-Diffusion: the released config.json (tests/fixtures/released/, copied verbatim from
shared/checkpoints/) with small dimensions, the released tensor names, bfloat16 on disk, and the drafting
LoRA in PEFT layout with the released adapter_config.json (r and lora_alpha scaled down together). The
weights come from a transformers Ministral3ForCausalLM, which stays the oracle.

SetDLM: the denoiser wrapper that kuleshov-group/setdlms' `save_pretrained_or_push_to_hub` writes around a
small Qwen3 base: config.json (model_type bd3lm, architectures SetDLM, a hydra backbone_config naming the
base, vocab_size = the tokenizer's length), pytorch_model.bin (torch.save, `backbone.model.*` keys, the tied
head under both names, the static_attention_mask buffer) and a tokenizer whose mask token is <|fim_middle|>.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from tiny_models import checkpoint

FIXTURES = Path(__file__).parent / "fixtures" / "released"
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=128)
LORA_R = 8          # released: r 128, lora_alpha 512 (scale 4); scaled down to the same scale
LINEAR_SHAPES = {"q_proj": ("self_attn", "q"), "k_proj": ("self_attn", "kv"), "v_proj": ("self_attn", "kv"),
                 "o_proj": ("self_attn", "o"), "gate_proj": ("mlp", "up"), "up_proj": ("mlp", "up"),
                 "down_proj": ("mlp", "down")}


def released(size: str, *parts: str) -> dict:
    return json.loads((FIXTURES / f"nemotron-labs-diffusion-{size}").joinpath(*parts).read_text())


def linear_shape(cfg: dict, target: str) -> tuple[int, int]:
    """(out, in) of a decoder linear layer under an HF config."""
    h, d = cfg["hidden_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv, i = cfg["num_attention_heads"] * d, (cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * d, \
        cfg["intermediate_size"]
    return {"q": (q, h), "kv": (kv, h), "o": (h, q), "up": (i, h), "down": (h, i)}[LINEAR_SHAPES[target][1]]


def write_adapter(dst: Path, cfg: dict, module_prefix: str, adapter_config: dict, std: float = 0.1,
                  seed: int = 0, r: int = LORA_R, zero: bool = False) -> Path:
    """A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, float32) for every layer and
    target of `adapter_config`; B = 0 (PEFT's initialisation) when `zero`."""
    g = torch.Generator().manual_seed(seed)
    config = dict(adapter_config, r=r, lora_alpha=adapter_config["lora_alpha"] * r // adapter_config["r"])
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for target in config["target_modules"]:
            out_f, in_f = linear_shape(cfg, target)
            name = f"base_model.model.{module_prefix}layers.{layer}.{LINEAR_SHAPES[target][0]}.{target}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(r, in_f, generator=g) * std
            b = torch.zeros(out_f, r) if zero else torch.randn(out_f, r, generator=g) * std
            tensors[f"{name}.lora_B.weight"] = b
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, dst / "adapter_model.safetensors")
    (dst / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dst


def released_names(size: str, layers: int) -> set[str]:
    names = released(size, "model.safetensors.header.json")
    keep = lambda n: (m := re.match(r"encoder\.layers\.(\d+)\.", n)) is None or int(m.group(1)) < layers  # noqa: E731
    return {n for n in names if n != "__metadata__" and keep(n)}


@functools.lru_cache(maxsize=None)
def nld_checkpoint(size: str = "3B", seed: int = 0, adapter: str = "random") -> tuple[Path, Path]:
    """(Nemotron-Labs-Diffusion directory, the same weights as an HF Ministral3 directory for transformers).
    `adapter`: "random", "zero" (B = 0) or "none"."""
    from transformers import Ministral3Config, Ministral3ForCausalLM

    config = released(size, "config.json") | SMALL
    hf_cfg = Ministral3Config(**{k: config[k] for k in (*SMALL, "rms_norm_eps", "rope_parameters", "bos_token_id",
                                                        "eos_token_id", "mask_token_id", "max_position_embeddings")},
                              sliding_window=None, tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = Ministral3ForCausalLM(hf_cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p).mul_(0.3).bfloat16())     # bf16 values: exact in every dtype
    root = Path(tempfile.mkdtemp(prefix=f"packed-ss-nld-{size}-"))
    hf.save_pretrained(root / "hf")
    nld = root / "nld"
    nld.mkdir()
    tensors = {("diffusion_head.weight" if n == "lm_head.weight" else "encoder." + n.removeprefix("model.")):
               t.bfloat16().contiguous() for n, t in hf.state_dict().items()}
    assert set(tensors) == released_names(size, SMALL["num_hidden_layers"]), "not the released tensor names"
    save_file(tensors, nld / "model.safetensors")
    (nld / "config.json").write_text(json.dumps(config, indent=2))
    if adapter != "none":
        write_adapter(nld / "linear_spec_lora", config, "encoder.", released(size, "linear_spec_lora",
                      "adapter_config.json"), seed=seed, zero=adapter == "zero")
    return nld, root / "hf"


def with_adapter(src: Path, dst: Path, targets=("o_proj",), std: float = 0.1, **config) -> Path:
    """A copy of an HF checkpoint directory shipping a drafting LoRA in `linear_spec_lora/`."""
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    adapter_config = dict(released("3B", "linear_spec_lora", "adapter_config.json"), target_modules=list(targets),
                          **config)
    write_adapter(dst / "linear_spec_lora", cfg, "model.", adapter_config, std=std)
    return dst


# -- SetDLM ------------------------------------------------------------------------------------------------
BASE_ID = "Qwen/Qwen3-Tiny"
MASK = "<|fim_middle|>"


def write_tokenizer(dst: Path, words: int, specials: list[str]) -> dict[str, int]:
    """A word-level tokenizer with `words` plain tokens and the given special tokens after them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({"mask_token": MASK, "eos_token": "<|endoftext|>",
                                                            "tokenizer_class": "Qwen2Tokenizer"}))
    return {s: tok.token_to_id(s) for s in specials}


@functools.lru_cache(maxsize=None)
def setdlm_checkpoint(kept_layers: int = 2) -> tuple[Path, Path]:
    """(the SetDLM wrapper directory, the Qwen3 base directory it names)."""
    base = checkpoint("qwen3-qknorm", num_hidden_layers=3, tie_word_embeddings=True)   # 97 embedding rows
    base_cfg = json.loads((base / "config.json").read_text())
    for key in ("mask_token_id",):          # a plain Qwen3 base has none
        base_cfg.pop(key, None)
    root = Path(tempfile.mkdtemp(prefix="packed-ss-setdlm-"))
    base_dir = root / "base"
    base_dir.mkdir()
    (base_dir / "config.json").write_text(json.dumps(base_cfg))
    out = root / "setdlm"
    out.mkdir()
    ids = write_tokenizer(out, 90, ["<|endoftext|>", "<|fim_prefix|>", MASK, "<|fim_suffix|>"])
    vocab = 90 + 4
    config = {
        "architectures": ["SetDLM"], "model_type": "bd3lm",
        "auto_map": {"AutoConfig": "diffusion.SetDLMConfig", "AutoModelForMaskedLM": "diffusion.SetDLM"},
        "backbone_config": {"_target_": "backbone_automodel.AutoModelFromPreTrained",
                            "automodel_cls": "AutoModelForCausalLM", "pretrained_model_name_or_path": BASE_ID,
                            "num_layers": kept_layers, "keep_top_layers": False, "reinit_model": False,
                            "trust_remote_code": True, "use_causal_mask": False, "attn_implementation": "sdpa"},
        "noise_config": {"_target_": "noise_schedule_noise_schedules.LinearNoise"},
        "tokenization_config": {"vocab_size": vocab, "mask_token_id": ids[MASK], "eos_token_id": ids["<|endoftext|>"]},
        "vocab_size": vocab, "mask_token_id": ids[MASK], "eos_token_id": ids["<|endoftext|>"],
        "bos_token_id": None, "pad_token_id": ids["<|endoftext|>"], "length": 256, "block_size": 4,
        "attn_backend": "sdpa", "setdlm_eos_last_in_target_order": False, "transformers_version": "4.52.4",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    from safetensors.torch import load_file

    weights = load_file(base / "model.safetensors")
    state = {}
    for name, tensor in weights.items():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m is None or int(m.group(1)) < kept_layers:
            state["backbone.model." + name] = tensor
    state["backbone.model.lm_head.weight"] = state["backbone.model.model.embed_tokens.weight"]   # tied, saved twice
    state["static_attention_mask"] = torch.ones(8, 8, dtype=torch.bool)
    torch.save(state, out / "pytorch_model.bin")
    return out, base_dir


def hf_cache(root: Path, base_dir: Path, repo_id: str = BASE_ID) -> Path:
    """A Hugging Face hub cache under `root` holding `base_dir`'s config.json as `repo_id`."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    shutil.copy(base_dir / "config.json", snap / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    return root
