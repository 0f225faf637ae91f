"""Random-weight checkpoints for tests, written with transformers so that it can serve as the oracle."""
from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import torch

# Three families the engine must load: llama with GQA (tied head), mistral with an untied head,
# qwen3 with per-head q/k RMSNorm. Weights ~ N(0, 0.3) give peaked logits, so greedy decoding has
# no near-ties for float64 round-off to flip.
CONFIGS = {
    "llama-gqa": dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mistral-untied": dict(model_type="mistral", num_attention_heads=4, num_key_value_heads=4,
                           tie_word_embeddings=False, sliding_window=None),
    "qwen3-qknorm": dict(model_type="qwen3", num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=False),
}


def hf_config(name: str, vocab_size: int = 97, **overrides):
    from transformers import AutoConfig

    kw = dict(CONFIGS[name])
    model_type = kw.pop("model_type")
    kw.update(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              max_position_embeddings=512, mask_token_id=vocab_size - 1, eos_token_id=vocab_size - 2,
              bos_token_id=None, pad_token_id=None, rms_norm_eps=1e-6)
    kw.update(overrides)
    return AutoConfig.for_model(model_type, **kw)


@functools.lru_cache(maxsize=None)
def checkpoint(name: str, vocab_size: int = 97, std: float = 0.3, seed: int = 0, **overrides) -> Path:
    """Directory of a saved random checkpoint (cached per process)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(name, vocab_size, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    path = Path(tempfile.mkdtemp(prefix=f"packed-ss-{name}-"))
    model.save_pretrained(path)
    return path


@functools.lru_cache(maxsize=None)
def hf_model(path: Path, dtype=torch.float64):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def hf_greedy(path: Path, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """transformers' own greedy continuation (generated tokens only, stop token included)."""
    model = hf_model(path)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos_token_id, pad_token_id=0, attention_mask=torch.ones(1, len(prompt),
                                                                                              dtype=torch.long))
    return out[0, len(prompt):].tolist()


def mid_output_token(tokens: list[int], start: int = 5) -> int:
    """A token that first appears in `tokens` at index >= start: a stop token the output reaches mid-way."""
    return next(t for i, t in enumerate(tokens) if i >= start and t not in tokens[:i])


def config_eos(monkeypatch, model, eos: int) -> None:
    """Make `eos` the model config's EOS for the rest of the test (what generate() stops at by default)."""
    monkeypatch.setattr(model, "cfg", dataclasses.replace(model.cfg, eos_token_ids=(eos,)))
