"""packed-ss: packed self-speculative decoding for dual-mode (diffusion-draft / AR-verify) models."""
from .engine import Engine, GenerateResult
from .loading import default_model_path, load_model
from .sampling import SamplingParams
from .tokenizer import load_tokenizer

__all__ = ["Engine", "GenerateResult", "SamplingParams", "default_model_path", "load_model", "load_tokenizer"]
