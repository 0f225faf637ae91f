"""packed-ss: packed self-speculative decoding for dual-mode (diffusion-draft / AR-verify) models.

Rooms: `model/` (the network, attention contract, loading), `decode/` (one step: acceptance, sampling,
state, epilogues, schedules), `runtime/` (the loop both orders share), `engine.py` (the facade), `lab/`
(training and benchmarks; nothing above imports it), `cli.py`.

Words, each for one thing:
- step: one model call and the state update that follows it (a program's `steps`); an iteration is one pass
  over a program's steps, between two reads of the status table.
- row: one query of a model call; a request contributes R rows ([B, R] inputs): anchors (their K/V enter the
  cache), scratch rows (drafting, never cached).
- block: the paper's block, B = W + 1 tokens, the most one iteration emits (`program.block`).
- slot: a request's place in a running batch (the index of its state row and page-table row).
- position: the index of a token's K/V in its request's cache (`cache_len` of them are valid).
- page: `page_size` cache positions of one request, the unit of the K/V pool (runtime/kv_pool.py); a request's
  row of the page table names its pages in order.
- sampling: a request's temperature, top-k, top-p (SamplingParams) and seed, kept as rows of its batch's state
  (`DecodeState.sampling`); a program knows only whether its requests sample (`sampled`), so sampled requests
  of any settings share one batch.
"""
from .decode.sampling import SamplingParams
from .engine import Engine
from .model import default_model_path, load_model, load_tokenizer
from .runtime import GenerateResult

__all__ = ["Engine", "GenerateResult", "SamplingParams", "default_model_path", "load_model", "load_tokenizer"]
