"""The serial reference of paper Proposition C.1, the oracle for every any-order schedule.

It replays a run's verification orders: iteration t generates its A_t positions pi_t(1..A_t) one at a
time, each from a fresh forward pass (no cache, no packing) over the prompt, the accepted tokens in
acceptance order and the group so far, with the same stop and truncation rules (AnyOrderState).
"""
from __future__ import annotations

import torch

from ...model.attention import Layout, packed_attention_ref
from .state import AnyOrderState, Iteration


@torch.inference_mode()
def predict(model, prompt: list[int], context: list[tuple[int, int]], position: int) -> int:
    """argmax p(x at output `position` | prompt, context in order): causal token rows, then one mask row."""
    n0, device = len(prompt), model.device
    tokens = prompt + [t for _, t in context] + [model.cfg.mask_token_id]
    positions = list(range(n0)) + [n0 + j for j, _ in context] + [n0 + position]
    n = len(tokens) - 1
    layout = Layout(n, torch.tensor([0] * n + [1], device=device), torch.tensor(list(range(n)) + [n - 1], device=device))
    cache = model.new_cache(n + 1)
    logits = model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device), layout, cache,
                   torch.zeros((), dtype=torch.int64, device=device), attend=packed_attention_ref)
    return int(logits[-1].argmax())


def serial_reference(model, prompt: list[int], trace: list[Iteration], max_new_tokens: int,
                     stop_sequences: list[tuple[int, ...]]) -> list[int]:
    """The output the serial reference returns for a run with iterations `trace`."""
    st = AnyOrderState(len(prompt), max_new_tokens, stop_sequences)
    for it in trace:
        context = [(j, st.tokens[j]) for j in st.cached] + st.pending   # P_{t-1} in acceptance order
        group = []
        for j in it.order[:it.accepted]:
            group.append((j, predict(model, prompt, context + group, j)))
        st.commit_unverified(group, it.window, rows=0)
    if not st.done:
        raise ValueError("trace: the replayed iterations do not fill positions 0..E")
    return st.output()
