"""The model: a dual-mode decoder (one forward evaluates a packed call), the packed-attention contract and
its torch reference, rope, config, and loading from local checkpoint directories with their tokenizers."""
from .dual_mode import DualModeModel, KVCache
from .loading import default_model_path, load_model
from .tokenizer import load_tokenizer

__all__ = ["DualModeModel", "KVCache", "default_model_path", "load_model", "load_tokenizer"]
