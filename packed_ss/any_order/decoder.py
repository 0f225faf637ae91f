"""A minimal driver of the any-order schedules, the shape of the shared runtime's loop: the prompt call,
then iterations of the schedule's steps, reading (done, hold) once per iteration; `resume()` when held.

`compile` wraps each step (input, model call, update) in torch.compile(fullgraph=True) with that backend.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams
from .call import ModelInput
from .schedules import SCHEDULES, AnyOrderSchedule
from .state import Iteration


@dataclass
class Decoded:
    tokens: list[int]
    nfe: int
    n_verify: int
    n_accepted: int
    trace: list[Iteration]
    reprocessed: int

    def output(self) -> list[int]:
        return self.tokens


class AnyOrderDecoder:
    def __init__(self, model, schedule: str, width: int, order: str, attend, cache_for=None,
                 compile: str | None = None):
        """`cache_for(capacity)` returns a KV cache view (the Engine shares its own); default: a new cache."""
        self.model, self.attend, self.width = model, attend, width
        self.schedule_name, self.order, self.compile = schedule, order, compile
        self.cache_for = cache_for or model.new_cache
        self.schedules: dict[SamplingParams, AnyOrderSchedule] = {}
        self.model_s = 0.0

    def schedule(self, params: SamplingParams) -> AnyOrderSchedule:
        if params not in self.schedules:
            self.schedules[params] = SCHEDULES[self.schedule_name](self.model, self.width, params, self.order)
        return self.schedules[params]

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                 stop_sequences: list[tuple[int, ...]]) -> Decoded:
        sched = self.schedule(params)
        cache = self.cache_for(len(prompt) + max_new_tokens + 3 * self.width + 1)
        st = sched.new_state(len(prompt), max_new_tokens, seed, [], stop_sequences)
        self.model_s = 0.0

        def call(inp: ModelInput) -> torch.Tensor:
            return self.model(inp.tokens, inp.positions, inp.layout, cache, inp.cache_len, attend=self.attend)

        def timed(inp: ModelInput) -> torch.Tensor:
            t0 = time.perf_counter()
            logits = call(inp)
            self.model_s += time.perf_counter() - t0
            return logits

        runs = [lambda st, step=step: step.update(st, call(step.inputs(st))) for step in sched.steps]
        if self.compile:
            runs = [torch.compile(run, fullgraph=True, backend=self.compile) for run in runs]
        else:
            runs = [lambda st, step=step: step.update(st, timed(step.inputs(st))) for step in sched.steps]
        with torch.inference_mode():
            prefill = sched.prefill(torch.tensor(prompt, dtype=torch.int64, device=self.model.device))
            prefill.update(st, timed(prefill.inputs(st)))
            for _ in range(max_new_tokens):   # every iteration resolves >= 1 position
                for run in runs:
                    run(st)
                done, hold = torch.stack([st.done, st.hold]).tolist()   # the one host read
                if hold:
                    sched.resume(st, timed)
                    done = bool(st.done)
                if done:
                    break
            else:
                raise RuntimeError("any-order decoder made no progress; this is a bug")
            tokens = st.out[:int(st.n_out)].tolist()
            return Decoded(tokens, int(st.nfe), int(st.n_verify), int(st.n_accepted),
                           sched.finish(st)["iterations"], int(st.reprocessed))
