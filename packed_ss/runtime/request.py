"""A decoding request as the runtime takes it (validated by the Engine), and what it returns."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    seed: int
    stop_ids: list[int]                      # one-token stops (EOS included)
    stop_sequences: list[tuple[int, ...]]    # stops of several tokens, matched once all are emitted


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
