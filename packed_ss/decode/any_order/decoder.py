"""The any-order decode loop: prompt call, then schedule iterations until positions 0..E are filled.

The window, order and acceptance are decided on the host from each call's argmax (u_t and p vary per
iteration, paper Table 2), so this loop reads the device once per call; the LTR schedules of
`packed_ss.decode.schedules` are the fixed-shape, sync-free ones.
"""
from __future__ import annotations

import time

import torch

from ..sampling import SamplingParams
from .schedules import SCHEDULES, Call
from .state import AnyOrderState


class AnyOrderDecoder:
    def __init__(self, model, schedule: str, width: int, order: str, attend, cache_for=None):
        """`cache_for(capacity)` returns a KV cache view (the Engine shares its own); default: a new cache."""
        self.model, self.attend, self.width = model, attend, width
        self.schedule_name, self.order = schedule, order
        self.cache_for = cache_for or model.new_cache
        self.model_s = 0.0

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                 stop_sequences: list[tuple[int, ...]]) -> AnyOrderState:
        device = self.model.device
        cache = self.cache_for(len(prompt) + max_new_tokens + 3 * self.width + 1)
        self.model_s = 0.0

        def run(st: AnyOrderState, call: Call, cache_len: int | None = None) -> torch.Tensor:
            tokens = torch.tensor(call.tokens, dtype=torch.int64, device=device)
            positions = torch.tensor(call.positions, dtype=torch.int64, device=device)
            length = torch.tensor(st.cache_len if cache_len is None else cache_len, device=device)
            t0 = time.perf_counter()
            logits = self.model(tokens, positions, call.layout(device), cache, length, attend=self.attend)
            self.model_s += time.perf_counter() - t0
            st.nfe += 1
            return logits

        seed_t = torch.tensor(seed, dtype=torch.int64, device=device)
        sched = SCHEDULES[self.schedule_name](run, self.model.cfg.mask_token_id, self.width, self.order, params,
                                              seed_t)
        st = AnyOrderState(len(prompt), max_new_tokens, stop_sequences)
        with torch.inference_mode():
            sched.prefill(st, prompt)
            while not st.done:
                if len(st.trace) > max_new_tokens:   # every iteration resolves >= 1 position
                    raise RuntimeError("any-order decoder made no progress; this is a bug")
                sched.iterate(st)
        return st
