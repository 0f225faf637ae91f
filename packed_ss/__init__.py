"""packed-ss: packed self-speculative decoding for dual-mode (diffusion-draft / AR-verify) models.

Rooms: `model/` (the network, attention contract, loading), `decode/` (one step: acceptance, sampling,
state, epilogues, schedules), `runtime/` (the loop both orders share), `engine.py` (the facade), `lab/`
(training and benchmarks; nothing above imports it), `cli.py`.
"""
from .decode.sampling import SamplingParams
from .engine import Engine
from .model import default_model_path, load_model, load_tokenizer
from .runtime import GenerateResult

__all__ = ["Engine", "GenerateResult", "SamplingParams", "default_model_path", "load_model", "load_tokenizer"]
