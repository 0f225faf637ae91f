"""The serial reference of paper Proposition C.1, the oracle for every any-order schedule.

It replays a run's verification orders: iteration t generates its A_t positions pi_t(1..A_t) one at a
time, each from a fresh forward pass (no cache, no packing) over the prompt, the accepted tokens in
acceptance order and the group so far, with the same stop and truncation rules, kept here on the host
independently of the decoder's device state.
"""
from __future__ import annotations

import torch

from ...model.attention import Layout, reference_attention
from .state import Iteration


@torch.inference_mode()
def logits_at(model, prompt: list[int], context: list[tuple[int, int]], position: int,
              drafting: bool = False) -> torch.Tensor:
    """The logits of p(x at output `position` | prompt, context in order): causal token rows, then one mask
    row, a verifier row or (`drafting`) a drafting row, to which a drafting adapter applies."""
    n0, device = len(prompt), model.device
    tokens = prompt + [t for _, t in context] + [model.cfg.mask_token_id]
    positions = list(range(n0)) + [n0 + j for j, _ in context] + [n0 + position]
    n = len(tokens) - 1
    layout = Layout(n, torch.tensor([0] * n + [1], device=device), torch.tensor(list(range(n)) + [n - 1], device=device),
                    n if drafting else None)
    cache = model.new_cache(n + 1)
    logits = model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device), layout, cache,
                   torch.zeros((), dtype=torch.int64, device=device), attend=reference_attention)
    return logits[-1]


def predict(model, prompt: list[int], context: list[tuple[int, int]], position: int) -> int:
    """argmax p(x at output `position` | prompt, context in order), the verifier's prediction."""
    return int(logits_at(model, prompt, context, position).argmax())


class Context:
    """P_t on the host: accepted (position, token) pairs in acceptance order, and E (Alg. 3 lines 11-13)."""

    def __init__(self, limit: int, stop_sequences: list[tuple[int, ...]]):
        self.tokens: list[int | None] = [None] * limit
        self.end, self.stop_sequences = limit - 1, stop_sequences
        self.order: list[int] = []

    def pairs(self) -> list[tuple[int, int]]:
        return [(j, self.tokens[j]) for j in self.order]

    def append(self, group: list[tuple[int, int]]) -> None:
        """Append C_t, then E <- end of the earliest fully accepted stop sequence; drop pairs after E."""
        for j, t in group:
            self.tokens[j] = t
            self.order.append(j)
        for seq in self.stop_sequences:
            n = len(seq)
            self.end = min([self.end] + [e for e in range(n - 1, self.end + 1)
                                         if tuple(self.tokens[e - n + 1:e + 1]) == tuple(seq)])
        self.tokens[self.end + 1:] = [None] * (len(self.tokens) - self.end - 1)
        self.order = [j for j in self.order if j <= self.end]

    @property
    def done(self) -> bool:
        return all(t is not None for t in self.tokens[:self.end + 1])


def serial_reference(model, prompt: list[int], trace: list[Iteration], max_new_tokens: int,
                     stop_sequences: list[tuple[int, ...]]) -> list[int]:
    """The output the serial reference returns for a run with iterations `trace`."""
    ctx = Context(max_new_tokens, stop_sequences)
    for it in trace:
        context, group = ctx.pairs(), []   # P_{t-1} in acceptance order
        for j in it.order[:it.accepted]:
            group.append((j, predict(model, prompt, context + group, j)))
        ctx.append(group)
    if not ctx.done:
        raise ValueError("trace: the replayed iterations do not fill positions 0..E")
    return ctx.tokens[:ctx.end + 1]
