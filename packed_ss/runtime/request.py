"""A decoding request as the runtime takes it (validated by the Engine), and what it returns."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class SamplingParams:
    """A request's sampling: temperature 0 means greedy; top_k / top_p None means no truncation."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rows(self, batch: int = 1, device="cpu") -> "Sampling":
        """These settings for every row of a batch of `batch` requests."""
        def full(value, dtype):
            return torch.full((batch,), value, dtype=dtype, device=device)
        return Sampling(full(self.temperature, torch.float64), full(self.top_k or 0, torch.int64),
                        full(1.0 if self.top_p is None else self.top_p, torch.float64))


class Sampling(NamedTuple):
    """Sampling settings per request of a batch, as device tensors [B] (the batch state's, DecodeState):
    temperature (0: greedy), top_k (0: none), top_p (1: none). Requests with any mix of settings share a batch."""
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    seed: int
    stop_ids: list[int]                      # one-token stops (EOS included)
    stop_sequences: list[tuple[int, ...]]    # stops of several tokens, matched once all are emitted
    params: SamplingParams = SamplingParams()   # its sampling: requests of any settings share a batch


@dataclass
class GenerateResult:
    tokens: list[int]     # generated tokens only, a stop token included when one was emitted
    nfe: int              # model forward passes, prompt processing included
    wall_s: float         # decoder wall time (prefill and every step)
    model_s: float        # the part of wall_s spent in model calls (nan when compiled or graphed: not separable)
    n_verify: int = 0     # verification calls (speculative schedules)
    n_accepted: int = 0   # draft tokens accepted over all verifications
    n_bonus: int = 0      # verifications that accepted their whole (non-empty) draft and emitted the bonus token
    accepted_at: list[int] | None = None   # per draft position k: verifications that accepted draft token k
    iterations: list | None = None   # any-order models: per iteration order, A_t, rows (any_order.Iteration)
    cached_tokens: int = 0   # prompt tokens whose K/V came from the prefix cache (not prefilled)

    @property
    def tokens_per_nfe(self) -> float:
        return len(self.tokens) / self.nfe if self.nfe else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per verification call."""
        return self.n_accepted / self.n_verify if self.n_verify else 0.0
